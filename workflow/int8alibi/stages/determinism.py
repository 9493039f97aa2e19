"""Stage 8b, determinism: do the two arms generate the same tokens, and does each repeat itself?

Reads every generate artifact and has ``engines.determinism`` join them under the identity
contract and tabulate agreement. A contract violation stops the stage, naming the field and both
values, unless ``--param allow_unverified=true``, which is then written into every row and the
manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engines.determinism import (TABLES, agreement_table, generations_table, identity_violations, kernels_table,
                                    read_artifacts, summary_table)
from ..config import Config
from ..engines.generation import RUNS
from ..errors import InputError
from ..provenance.manifest import write_manifest
from ..files.parquet import write_table
from ..quant.variants import CHECKPOINT_VARIANTS
from ..runtime.runner import log, stage_main


def parse_flag(value: Any, name: str) -> bool:
    """A boolean ``--param``: exactly true or false."""
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise InputError(f"--param {name}={value!r}: expected true or false")
    return text == "true"


def run(cfg: Config, out_dir: Path, runs: Path, allow_unverified: str = "false") -> None:
    """Join every artifact under the identity contract and tabulate agreement."""
    allow = parse_flag(allow_unverified, "allow_unverified")
    arm_a, arm_b = cfg.resolved_arms  # resolved once per run, when it was planned (the generate jobs' arms)
    arms = (arm_a, arm_b)
    arts = read_artifacts(Path(runs), arms)
    violations = identity_violations(arts, arms, allow)
    if violations:
        log.warning("determinism: %d identity violation(s) allowed by allow_unverified=true", len(violations))
    agreement = agreement_table(arts, arms, allow)
    summary = summary_table(agreement, arts, arms, violations, allow)
    tables = {"generations": generations_table(arts, allow), "agreement": agreement, "summary": summary,
              "kernels": kernels_table(arts)}
    outputs = {name: write_table(frame, out_dir / f"{name}.parquet", TABLES[name][0], sort_by=TABLES[name][1])
               for name, frame in tables.items()}
    write_manifest(
        out_dir, stage="determinism", outputs=outputs,
        inputs=[p for art in arts.values() for p in art.paths],
        params={"allow_unverified": allow, "arms": list(arms), "device": cfg.resolved_device,
                "engine": sorted({str(art.identity.engine.get("name")) for art in arts.values()}),
                "checkpoints": list(CHECKPOINT_VARIANTS), "runs": list(RUNS)},
        arms=[dict(arts[(arm, CHECKPOINT_VARIANTS[0], 1)].identity.kernel_evidence) for arm in arms],
        extra={"identity": {"verified": not violations, "allow_unverified": allow,
                            "violations": [{"a": sa, "b": sb, "field": m.field, "value_a": m.a, "value_b": m.b}
                                           for sa, sb, m in violations]}},
        device="cpu",  # determinism only reads tables; the arms' devices are in their identity files
    )
    log.info("determinism: %s", summary.iloc[0].to_dict())


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

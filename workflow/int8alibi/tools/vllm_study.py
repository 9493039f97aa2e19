"""The papers' vLLM treatment on one GPU host: the DAG's own rules up to the determinism table with
vLLM's engine, then the agreement and the kernel vLLM logged, in the papers' terms.

It asks Snakemake for the determinism stage's outputs of a run whose arms are the vLLM pair on CUDA
with ``engine: vllm`` (planning refuses that run where vLLM cannot be imported), so model,
reference, requant, the generate jobs (both kernels, every checkpoint, two cold runs) and
determinism run exactly as they do in the full pipeline, under the gpu profile. At the end it prints
the agreement per checkpoint, each arm's self-consistency and the kernel class vLLM logged for every
artifact; ``--logs-to`` copies one vLLM log per arm (the fixture the log-parsing tests read).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..engines.determinism import AGREEMENT_SCHEMA, SUMMARY_SCHEMA
from ..engines.generation import RUNS, artifact_dir, artifact_paths
from ..engines.identity import read_identity
from ..engines.vllm_engine import ARM_KERNELS
from ..files.parquet import read_table
from ..stage_spec import MANIFEST, table
from ..quant.variants import CHECKPOINT_VARIANTS

ARMS = list(ARM_KERNELS)


def snakemake_argv(config_file: Path, results: str, root: Path | None, cores: int,
                   extra: Sequence[str] = ()) -> list[str]:
    """Snakemake for the determinism stage's manifest of the vLLM pair on CUDA, vLLM's engine
    (``results`` under ``root`` when given, as the config's ``results_root``)."""
    where = [f"results={results}", *([f"results_root={root}"] if root is not None else [])]
    return [sys.executable, "-m", "snakemake", "--profile", "profiles/gpu", "--cores", str(cores),
            "--configfile", str(config_file),
            "--config", "device=cuda", f"arms=[{','.join(ARMS)}]", "engine=vllm", *where,
            *extra, "--", str(Path(root or ".") / results / table("determinism", MANIFEST))]


def report(results: Path) -> dict[str, Any]:
    """What the determinism stage wrote, in the papers' terms, from its own tables and identities."""
    agreement = read_table(results / table("determinism", "agreement"), AGREEMENT_SCHEMA)
    summary = read_table(results / table("determinism", "summary"), SUMMARY_SCHEMA).iloc[0].to_dict()
    counts: dict[str, dict[str, str]] = {}
    for (checkpoint, comparison), rows in agreement.groupby(["checkpoint", "comparison"], sort=True):
        counts.setdefault(str(checkpoint), {})[str(comparison)] = f"{int(rows['identical'].sum())}/{len(rows)}"
    kernels = {f"{arm}/{c}/run{k}": read_identity(artifact_paths(artifact_dir(results / "determinism" / "runs", arm, c,
                                                                               k))[1]).kernel_evidence.get("selected")
               for arm in ARMS for c in CHECKPOINT_VARIANTS for k in RUNS}
    return {"agreement": counts, "identity": summary["identity"], "self_consistent": summary["self_consistent"],
            "kernels": kernels}


def copy_logs(results: Path, target: Path) -> list[Path]:
    """One vLLM log per arm (own checkpoint, run 1): the fixture the log-parsing tests read."""
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for arm in ARMS:
        log = artifact_dir(results / "determinism" / "runs", arm, "own", 1) / "vllm" / f"{arm}.vllm.log"
        if log.is_file():
            copied.append(Path(shutil.copyfile(log, target / f"{arm}.vllm.log")))
    return copied


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m int8alibi.tools.vllm_study", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("config/synthetic-qwen3-1.7b.yaml"))
    parser.add_argument("--results", default="results/synthetic-qwen3-1.7b-vllm")
    parser.add_argument("--results-root", type=Path, default=None, help="an absolute folder the results go under")
    parser.add_argument("--cores", type=int, default=8, help="Snakemake's cores (generate jobs share the GPU)")
    parser.add_argument("--logs-to", type=Path, default=None, help="copy one vLLM log per arm here (test fixture)")
    parser.add_argument("snakemake", nargs="*", help="further Snakemake arguments (after --), e.g. -n")
    args = parser.parse_args(argv)
    results = Path(args.results_root or ".") / args.results
    try:
        done = subprocess.run(snakemake_argv(args.config, args.results, args.results_root, args.cores, args.snakemake),
                              check=False)
    finally:
        if args.logs_to is not None:
            print("copied", [str(p) for p in copy_logs(results, args.logs_to)], flush=True)
    if done.returncode != 0:
        print(f"int8alibi.tools.vllm_study: snakemake failed (status {done.returncode}); its log says why",
              file=sys.stderr)
        return 1
    if (results / table("determinism", "summary")).is_file():
        print(json.dumps(report(results), indent=1, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

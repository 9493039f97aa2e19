"""``python -m int8alibi.tools.synthetic_compare``: the compare stage's comparison on synthetic operands.

``python -m int8alibi.tools.synthetic_compare --synthetic-shapes qwen3-1.7b --m 512 --arms cublaslt,triton
--out DIR`` runs both arms on seeded synthetic operands of a real model's shapes (no model, no
pipeline run) and writes the compare stage's tables and a manifest, marked exploratory.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.bitwise_prediction import POW2_SETTING, predict_layer
from ..device import resolve_device
from ..errors import Int8AlibiError
from ..kernels import select
from ..analysis.layer_comparison import SYNTHETIC, layer_rows, log_summary, near_zero_fraction, write_tables
from ..kernels.layer_operands import ModelShapes, operand_digest, synthetic_layers
from ..progress import Progress
from ..provenance.manifest import write_manifest


def compare_synthetic(shapes: str | ModelShapes, m: int, arms: str | list[str], out_dir: Path, *,
                      device: str = "auto", seed: int = 0, blocks: int | None = None,
                      project_root: str | Path = ".") -> pd.DataFrame:
    """The comparison tables for seeded synthetic operands of a real model's shapes (no model needed).

    Every linear layer (or those of the first ``blocks`` blocks), phases prefill (M=``m``) and
    decode (M=1, its own seed), settings ``real`` and ``pow2-snapped``; ``pow2-requant`` needs a
    requantized checkpoint and is not applicable here (the manifest says so).
    Predictions are computed in-run from the same operands, so they are not pinned: the tables and
    the manifest are marked exploratory. Returns the summary table.
    """
    torch_device = resolve_device(device)
    arm_a, arm_b, selection = select(arms, torch_device)
    fraction = near_zero_fraction(Path(project_root))
    rows: list[dict[str, Any]] = []
    for phase, rows_m, phase_seed in (("prefill", m, seed), ("decode", 1, seed + 1)):
        layers = synthetic_layers(shapes, m=rows_m, seed=phase_seed, blocks=blocks)
        for op in Progress(layers, desc=f"compare synthetic/{phase}", unit="layer"):
            predicted = bool(predict_layer(op, POW2_SETTING["own"], torch_device)["predicted_bitwise_pow2"])
            rows.extend(layer_rows(op, operand_digest(op), SYNTHETIC, phase, predicted,
                                   arm_a, arm_b, torch_device, True, fraction))
    out_dir = Path(out_dir)
    layers_path, summary_path, summary = write_tables(rows, out_dir, True)
    log_summary(summary)
    write_manifest(
        out_dir, stage="compare", outputs={"layers": layers_path, "summary": summary_path}, inputs={},
        params={"synthetic_shapes": shapes if isinstance(shapes, str) else repr(shapes), "m": m, "seed": seed,
                "blocks": blocks, "arms": arms, "device": str(torch_device)},
        arms=[arm_a.evidence(), arm_b.evidence()], exploratory=True,
        protocol_root=Path(project_root) / "preregistration", device=torch_device,
        extra={"selection": selection, "operands": f"synthetic_layers({shapes!r}, m, seed)",
               "prediction_pin": "not applicable: synthetic operands, predictions computed in-run",
               "pow2-requant": "not applicable: synthetic operands have no requantized checkpoint"},
    )
    return summary


def synthetic_main(argv: list[str]) -> int:
    """CLI of ``compare_synthetic``."""
    parser = argparse.ArgumentParser(prog="python -m int8alibi.tools.synthetic_compare")
    parser.add_argument("--synthetic-shapes", required=True, help="e.g. qwen3-1.7b (operands.QWEN3_SHAPES)")
    parser.add_argument("--m", type=int, default=512, help="prefill rows M")
    parser.add_argument("--arms", default="auto", help="auto or two arm names separated by a comma")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--blocks", type=int, default=None, help="only the first BLOCKS blocks (default: all)")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    arms: str | list[str] = args.arms if args.arms == "auto" else args.arms.split(",")
    try:
        compare_synthetic(args.synthetic_shapes, args.m, arms, args.out, device=args.device, seed=args.seed,
                          blocks=args.blocks)
    except Int8AlibiError as exc:
        print(f"int8alibi: compare (synthetic) failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(synthetic_main(sys.argv[1:]))

"""``int8alibi conform``: run checks 1-6 between any two kernel arms and say what they certify.

Each layer runs through both arms twice: under its real scales and with every scale snapped to
its nearest power of two. Each arm gets its own copy of the operands; check 1 compares the
copies the arms held after their calls (so a kernel that writes into its inputs is caught).
Applicability is reported separately from the verdict: a check that does not apply certifies
nothing, and the summary says so instead of counting it as a pass.

Every layer x regime (a setting) gets two readings of the outputs: the tolerance one (check 6) and a
bitwise one. Both are reported because the tolerance passes legitimate and defective epilogues
alike: the other legitimate scale order differs from the reference by one bf16 spacing on a few
elements, and only the bitwise reading shows it.

The batch reading asks of each arm alone whether a row's output depends on its batch: every row is
computed again inside seeded batches of other sizes and other rows (``int8alibi.batch.layer``, the
registered draws and seed of ``preregistration/batch.yaml``) and compared bit for bit with its
output at the layer's own M. An INT8 W8A8 GEMM with per-token scales is predicted batch invariant;
an arm that is not is named with the first M where a row changed and by how many ulps.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import torch

from ..arith import bf16_bits, exact_accumulator, ulp_distance
from ..batch.layer import INT8, LAYER_KEY, LAYER_SCHEMA, co_batches, layer_rows
from ..faults.checks import OperandSet, Thresholds, evaluate_arms
from ..device import resolve_device
from ..errors import InputError, Int8AlibiError
from ..faults.pipeline import REGIMES, as_scales, regime_scales
from ..faults.sources import LayerSelection, OperandSource
from ..kernels import registry
from ..kernels.base import Arm
from ..kernels.layer_operands import QWEN3_SHAPES, Operands, synthetic_layers
from ..progress import Progress
from ..protocol import load
from ..provenance.manifest import write_manifest
from ..files.parquet import write_table

LAYER_CHECKS = (1, 2, 3, 4, 5, 6)  # check 7 needs logits: never at layer level
TOLERANCE_CHECK = 6
NOT_APPLICABLE = "not applicable"

# What a silent applicable check certifies, and what no verdict of it can certify.
CERTIFIES = {
    1: "both arms were handed, and kept, bit-identical a_q, w_q, s_a, s_w",
    2: "the reduction depth cannot overflow int32 (16256*K < 2^31)",
    3: "every exact accumulator converts to float32 without rounding (max |acc| <= 2^24)",
    4: "each arm's int32 accumulator is the exact integer product of arm A's operands",
    5: "bit-identical outputs under power-of-two scales, where a correct epilogue has no freedom left",
    6: "under real scales the outputs are within the pinned ulp tolerance and agree on non-finite positions",
}
CANNOT = {
    1: "that the operands are the right ones (correctly quantized, from the right layer): only that both arms "
       "got the same",
    2: "anything about the values computed; it bounds the depth only",
    3: "anything about either arm; it is a property of the operands",
    4: "anything after the accumulator (the epilogue); not applicable when an arm hides its accumulator",
    5: "behaviour under real scales, and a defect that only appears with non-power-of-two scales",
    6: "an epilogue defect that stays within the tolerance (scale precision, double rounding, truncation, "
       "fused order all do): a real defect passes",
}

CONFORM_SCHEMA = pa.schema([
    pa.field("layer", pa.string(), nullable=False),
    pa.field("regime", pa.string(), nullable=False),
    pa.field("check", pa.int32(), nullable=False),
    pa.field("applicable", pa.bool_(), nullable=False),
    pa.field("fired", pa.bool_(), nullable=True),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("m", pa.int64(), nullable=False),
    pa.field("k", pa.int64(), nullable=False),
    pa.field("n", pa.int64(), nullable=False),
    pa.field("differing", pa.int64(), nullable=False),
    pa.field("max_ulp", pa.int64(), nullable=True),
    pa.field("nonfinite", pa.int64(), nullable=False),
    # The setting's two readings (repeated on each check's row, as the output columns above are):
    pa.field("elements", pa.int64(), nullable=False),
    pa.field("nonfinite_mismatch", pa.int64(), nullable=False),
    pa.field("tolerance", pa.string(), nullable=False),   # passed, failed or not applicable (check 6)
    pa.field("bitwise", pa.string(), nullable=False),     # identical or differs
])
CONFORM_KEY = ["layer", "regime", "check"]


def _run_arm(arm: Arm, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
             device: torch.device) -> tuple[OperandSet, torch.Tensor | None, torch.Tensor]:
    """Hand ``arm`` its own copy of the operands; return (what it held afterwards, accumulator, output)."""
    mine = [t.to(device).clone() for t in (a_q, w_q, s_a, s_w)]
    y = arm.scaled_mm(*mine)
    acc = arm.accumulator(mine[0], mine[1])
    return OperandSet(mine[0], mine[1], mine[2], mine[3]), acc, y


def nonfinite_mismatches(y_a: torch.Tensor, y_b: torch.Tensor, nonfinite: int) -> int:
    """Elements whose bits differ where either value is inf or NaN; ``nonfinite`` (positions with an inf
    or NaN on either side) 0 skips the pass over the outputs.

    They have no ulp distance, so the maximum leaves them out; counting them apart keeps an inf or
    NaN from hiding behind a small maximum.
    """
    if not nonfinite:
        return 0
    y_b = y_b.to(y_a.device)
    differ = bf16_bits(y_a) != bf16_bits(y_b)
    return int(torch.count_nonzero(differ & (ulp_distance(y_a, y_b) < 0)).item())


def reading(applicable: bool, fired: bool | None) -> str:
    """A check's verdict as a word: one that does not apply certifies nothing, so it never reads as passed."""
    if not applicable:
        return NOT_APPLICABLE
    return "failed" if fired else "passed"


def conform_layer(op: Operands, arm_a: Arm, arm_b: Arm, th: Thresholds, device: torch.device) -> list[dict[str, Any]]:
    """Checks 1-6 between the two arms on one layer, in both scale regimes: one row per regime x check."""
    name = f"layer {op.layer!r}"
    s_a = as_scales(op.s_a.to(device), op.m, f"{name} s_a")
    s_w = as_scales(op.s_w.to(device), op.n, f"{name} s_w")
    a_q, w_q = op.a_q.to(device), op.w_q.to(device)
    exact_a = exact_accumulator(a_q, w_q)
    rows = []
    for regime in REGIMES:
        sa, sw = regime_scales(s_a, regime, f"{name} s_a"), regime_scales(s_w, regime, f"{name} s_w")
        held_a, acc_a, y_a = _run_arm(arm_a, a_q, w_q, sa, sw, device)
        held_b, acc_b, y_b = _run_arm(arm_b, a_q, w_q, sa, sw, device)
        # Check 3 looks at the exact accumulators of both arms' operands; B's differ only if B's int8 tensors do.
        same_int8 = torch.equal(held_b.a_q, a_q) and torch.equal(held_b.w_q, w_q)
        exact_b = exact_a if same_int8 else exact_accumulator(held_b.a_q, held_b.w_q)
        absmax = max(int(exact_a.abs().max().item()), int(exact_b.abs().max().item()))
        ev, results = evaluate_arms(held_a, held_b, absmax, (acc_a, acc_b), exact_a, y_a, y_b, th)
        out = ev.outputs
        readings = {
            "elements": out.elements, "nonfinite_mismatch": nonfinite_mismatches(y_a, y_b, out.nonfinite),
            "tolerance": next(reading(r.applicable, r.fired) for r in results if r.check == TOLERANCE_CHECK),
            "bitwise": "differs" if out.differing else "identical",
        }
        for result in results:
            if result.check not in LAYER_CHECKS:
                continue
            rows.append({
                "layer": op.layer, "regime": regime, "check": result.check, "applicable": result.applicable,
                "fired": result.fired, "reason": result.reason, "m": op.m, "k": op.k, "n": op.n,
                "differing": out.differing, "max_ulp": out.max_finite_ulp, "nonfinite": out.nonfinite,
                **readings,
            })
    return rows


def summarize(table: pd.DataFrame) -> list[str]:
    """Per regime x check: over how many layers it applied, how often it fired, and what that means."""
    lines = []
    for regime in REGIMES:
        scales = "checkpoint scales" if regime == "own" else "every scale snapped to 2^round(log2 s)"
        lines.append(f"regime {regime} ({scales}):")
        part = table[table["regime"] == regime]
        for check in LAYER_CHECKS:
            rows = part[part["check"] == check]
            applied = rows[rows["applicable"]]
            fired = int(applied["fired"].astype(bool).sum())
            total = len(rows)
            if applied.empty:
                verdict = f"NOT APPLICABLE on all {total} layers ({rows['reason'].iloc[0]}): certifies nothing here"
            elif fired:
                verdict = f"FIRED on {fired} of {len(applied)} layers where applicable"
            else:
                verdict = f"silent on all {len(applied)} layers where applicable: certifies {CERTIFIES[check]}"
            if 0 < len(applied) < total:
                verdict += f"; not applicable on {total - len(applied)}"
            lines.append(f"  check {check}: {verdict}")
            lines.append(f"           cannot certify: {CANNOT[check]}")
    return lines


def settings(table: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (layer x regime), in run order: the readings repeat on every check's row."""
    return table[table["check"] == TOLERANCE_CHECK].reset_index(drop=True)


def setting_records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Each setting's readings as plain Python values (what --json prints)."""
    return [
        {"layer": r.layer, "regime": r.regime, "m": int(r.m), "k": int(r.k), "n": int(r.n),
         "tolerance": r.tolerance, "bitwise": r.bitwise, "differing": int(r.differing), "elements": int(r.elements),
         "max_ulp": None if pd.isna(r.max_ulp) else int(r.max_ulp), "nonfinite_mismatch": int(r.nonfinite_mismatch)}
        for r in settings(table).itertuples(index=False)
    ]


def overall(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Both readings over every setting. Tolerance passes only where it applied and never failed;
    bitwise sums the elements and takes the largest finite ulp distance."""
    applied = [r for r in records if r["tolerance"] != NOT_APPLICABLE]
    failed = sum(r["tolerance"] == "failed" for r in applied)
    differing = sum(r["differing"] for r in records)
    ulps = [r["max_ulp"] for r in records if r["max_ulp"] is not None]
    return {
        "tolerance": {"verdict": NOT_APPLICABLE if not applied else "failed" if failed else "passed",
                      "settings": len(records), "applicable": len(applied), "failed": failed},
        "bitwise": {"verdict": "differs" if differing else "identical", "differing": differing,
                    "elements": sum(r["elements"] for r in records), "max_ulp": max(ulps) if ulps else None,
                    "nonfinite_mismatch": sum(r["nonfinite_mismatch"] for r in records)},
    }


def bitwise_text(r: dict[str, Any]) -> str:
    """'identical', or 'differs in N of M elements, max ulp U' (and the non-finite mismatches, if any)."""
    if not r["differing"]:
        return "identical"
    ulp = "n/a (no finite pair)" if r["max_ulp"] is None else r["max_ulp"]
    text = f"differs in {r['differing']:,} of {r['elements']:,} elements, max ulp {ulp}"
    if r["nonfinite_mismatch"]:
        text += f", {r['nonfinite_mismatch']:,} non-finite mismatch{'' if r['nonfinite_mismatch'] == 1 else 'es'}"
    return text


def tolerance_text(t: dict[str, Any]) -> str:
    """The overall tolerance verdict, with the settings it could not apply to named as such."""
    if t["verdict"] == NOT_APPLICABLE:
        return NOT_APPLICABLE
    unapplied = t["settings"] - t["applicable"]
    if t["verdict"] == "failed":
        text = f"FAILED on {t['failed']} of {t['applicable']} settings where it applies"
    else:
        text = "passed" if not unapplied else f"passed on {t['applicable']} of {t['settings']} settings"
    return text + (f", not applicable on {unapplied}" if unapplied else "")


def spacings(ulps: int) -> str:
    """The pinned tolerance in the words the summary line uses."""
    return "one bf16 spacing" if ulps == 1 else f"{ulps} bf16 spacings"


def setting_lines(records: list[dict[str, Any]], ulp_tolerance: int) -> list[str]:
    """One line per setting: both readings side by side."""
    lines = [f"per setting (tolerance: check 6, within {spacings(ulp_tolerance)}; bitwise: every output bit):"]
    lines += [f"  {r['layer']} {r['regime']} (m={r['m']} k={r['k']} n={r['n']}): tolerance {r['tolerance']}; "
              f"bitwise {bitwise_text(r)}" for r in records]
    return lines


def batch_ms(option: str | None, registered: dict[str, list[int]]) -> tuple[list[int], bool]:
    """(Ms, explicit): ``--batch-ms`` as given, or every M registered for any size profile."""
    if option is None:
        return sorted({int(m) for ms in registered.values() for m in ms}), False
    try:
        ms = sorted({int(v) for v in option.split(",")})
    except ValueError:
        raise InputError(f"--batch-ms {option!r}: expected comma-separated integers") from None
    if ms[0] < 1:
        raise InputError(f"--batch-ms {option!r}: every M must be at least 1")
    return ms, True


def batch_layer(op: Operands, arms: tuple[Arm, ...], ms: list[int], explicit: bool, draws: int, seed: int,
                device: torch.device) -> list[dict[str, Any]]:
    """The batch reading's rows for one layer: each arm at every M that fits its rows, and its own M."""
    if explicit and ms[-1] > op.m:
        raise InputError(f"--batch-ms: M={ms[-1]} is larger than the {op.m} rows of layer {op.layer}")
    fit = sorted({*(m for m in ms if m <= op.m), op.m})
    batches = co_batches(op.m, fit, draws, seed, f"conform batch reading of {op.layer}")
    gemms = {f"{label}: {arm.name}": (INT8, arm.scaled_mm) for label, arm in zip(("arm A", "arm B"), arms)}
    return layer_rows("operands", op.layer, op.to(device), gemms, batches)


def batch_verdicts(table: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per arm: invariant or not, over how many rows and layers, and where it first was not."""
    verdicts = {}
    for gemm, part in table.groupby("gemm", sort=True):
        differing = part[part["rows_differing"] > 0].sort_values(["m", "layer"])
        record: dict[str, Any] = {"batch_invariant": differing.empty, "rows": int(part["rows"].sum()),
                                  "rows_differing": int(part["rows_differing"].sum()),
                                  "layers": int(part["layer"].nunique()), "ms": sorted(int(m) for m in set(part["m"]))}
        if not differing.empty:
            first = differing.iloc[0]
            record.update(first_m=int(first["m"]), first_layer=str(first["layer"]),
                          first_rows_differing=int(first["rows_differing"]), first_rows=int(first["rows"]),
                          max_ulp=None if differing["max_ulp"].isna().all() else int(differing["max_ulp"].max()),
                          ms_differing=sorted(int(m) for m in set(differing["m"])))
        verdicts[str(gemm)] = record
    return verdicts


def batch_text(gemm: str, v: dict[str, Any]) -> str:
    if v["batch_invariant"]:
        return (f"batch: {gemm}: batch invariant: all {v['rows']} rows of {v['layers']} layers bit-identical at "
                f"M in {v['ms']} and among other rows")
    ulp = "non-finite" if v["max_ulp"] is None else f"up to {v['max_ulp']} ulp"
    return (f"batch: {gemm}: NOT batch invariant: {v['rows_differing']} of {v['rows']} rows differ ({ulp}) at M in "
            f"{v['ms_differing']}; first at M={v['first_m']} ({v['first_layer']}: {v['first_rows_differing']} of "
            f"{v['first_rows']} rows)")


def _layers(args: argparse.Namespace) -> tuple[Iterator[Operands], dict[str, Path], str]:
    selection = LayerSelection.parse(args.layers)
    if args.operands is not None:
        source = OperandSource.resolve(args.operands)
        return selection.apply(source.layers()), source.inputs(), str(source.path)
    if args.shapes not in QWEN3_SHAPES:
        raise InputError(f"--shapes {args.shapes!r}: unknown (known: {', '.join(QWEN3_SHAPES)})")
    ops = synthetic_layers(args.shapes, m=args.m, seed=args.seed)
    return selection.apply(ops), {}, f"synthetic_layers({args.shapes!r}, m={args.m}, seed={args.seed})"


def _arm(name: str, device: torch.device) -> Arm:
    arm = registry.get(name, device)
    ok, why = arm.available()
    if not ok:
        raise InputError(f"arm {name!r} is not available on {device}: {why}")
    return arm


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="int8alibi conform", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit status: 0 when no applicable check fired, 1 when one did, 2 when the run itself failed\n"
               "(bad input, unavailable arm; stdout then holds no JSON). The bitwise and batch readings never change\n"
               "it: outputs that differ within the tolerance under real scales exit 0; read 'bitwise' or 'batch'\n"
               "to gate on them.")
    p.add_argument("--arm-a", required=True, help="registry name or module:function")
    p.add_argument("--arm-b", required=True, help="registry name or module:function")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--operands", type=Path, help="capture index, its directory, or operand safetensors")
    src.add_argument("--shapes", help="synthetic operands of a model's shapes (e.g. qwen3-1.7b)")
    p.add_argument("--m", type=int, default=512, help="tokens per synthetic layer (with --shapes)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic operands (with --shapes)")
    p.add_argument("--layers", type=int, default=None, help="run the first N layers only")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--protocol", type=Path, default=Path("preregistration"),
                   help="protocol directory (thresholds; the batch reading's draws, seed and Ms)")
    p.add_argument("--batch-ms", default=None,
                   help="batch sizes for the batch reading, e.g. 1,2,8 (default: every M preregistration/batch.yaml "
                        "registers; those above a layer's rows are left out, an explicit one is refused)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout (per setting and overall: both readings and their "
                        "counts); the console text goes to stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the checks, print what they certify and both readings, write conform.parquet + manifest
    (with ``--json`` the console text goes to stderr and stdout holds one JSON object).

    Exit 0 when no applicable check fired, 1 when one did, 2 when the run itself failed (bad
    input, unavailable arm), so a caller can tell a finding from an error.
    """
    args = _parser().parse_args(argv)
    try:
        return _conform(args)
    except Int8AlibiError as exc:
        print(f"int8alibi conform: {exc}", file=sys.stderr)
        return 2


def _conform(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    protocol = load(args.protocol)
    th = Thresholds.from_protocol(protocol.thresholds)
    spec = protocol.batch["layer"]
    ms, explicit = batch_ms(args.batch_ms, spec["ms"])
    arm_a, arm_b = _arm(args.arm_a, device), _arm(args.arm_b, device)
    layers, inputs, source = _layers(args)
    rows: list[dict[str, Any]] = []
    batch_rows: list[dict[str, Any]] = []
    for i, op in enumerate(Progress(layers, desc="conform", unit="layer", total=args.layers)):
        rows.extend(conform_layer(op, arm_a, arm_b, th, device))
        batch_rows.extend(batch_layer(op, (arm_a, arm_b), ms, explicit, int(spec["draws"]), int(spec["seed"]) + i,
                                      device))
    if not rows:
        raise InputError("conform: no layers to check")
    table = pd.DataFrame.from_records(rows)
    table["max_ulp"] = pd.Series([None if pd.isna(v) else int(v) for v in table["max_ulp"]], dtype=object)
    table["fired"] = pd.Series([None if v is None else bool(v) for v in table["fired"]], dtype=object)
    args.out.mkdir(parents=True, exist_ok=True)
    path = write_table(table, args.out / "conform.parquet", CONFORM_SCHEMA, CONFORM_KEY)
    batch_table = pd.DataFrame(batch_rows, columns=LAYER_SCHEMA.names).astype({"max_ulp": "Int32"})
    batch_path = write_table(batch_table, args.out / "conform_batch.parquet", LAYER_SCHEMA, LAYER_KEY)
    batch = batch_verdicts(batch_table)
    records = setting_records(table)
    both = overall(records)
    fired = bool(table["fired"].fillna(False).astype(bool).any())
    console = sys.stderr if args.json else sys.stdout
    lines = [f"conform: arm A = {arm_a.name}, arm B = {arm_b.name}, {table['layer'].nunique()} layers of {source}",
             *summarize(table), *setting_lines(records, th.ulp_tolerance),
             *(batch_text(gemm, v) for gemm, v in batch.items())]
    print("\n".join(lines), file=console)
    write_manifest(
        args.out, stage="conform", outputs={"conform": path, "conform_batch": batch_path}, inputs=inputs,
        params={"arm_a": args.arm_a, "arm_b": args.arm_b, "source": source, "layers": args.layers,
                "device": str(device), "ulp_tolerance": th.ulp_tolerance,
                "batch": {"ms": ms, "explicit": explicit, "draws": spec["draws"], "seed": spec["seed"]}},
        arms=[arm_a.evidence(), arm_b.evidence()], protocol_root=args.protocol,
        extra={"any_fired": fired, "layers": int(table["layer"].nunique()),
               "tolerance": both["tolerance"]["verdict"], "bitwise": both["bitwise"]["verdict"],
               "batch_invariant": {gemm: v["batch_invariant"] for gemm, v in batch.items()}}, device=device,
    )
    print(f"conform: {'some applicable check FIRED' if fired else 'no applicable check fired'}; "
          f"tolerance ({spacings(th.ulp_tolerance)}): {tolerance_text(both['tolerance'])}; "
          f"bitwise: {bitwise_text(both['bitwise'])}", file=console)
    code = 1 if fired else 0
    if args.json:
        print(json.dumps({"arm_a": arm_a.name, "arm_b": arm_b.name, "source": source,
                          "ulp_tolerance": th.ulp_tolerance, "settings": records, "overall": both, "batch": batch,
                          "any_check_fired": fired, "exit_status": code}, indent=2))
    return code


if __name__ == "__main__":
    raise SystemExit(main())

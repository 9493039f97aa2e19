"""Load the protocol from preregistration/: every file schema-validated, then cross-checked.

Cross-checks catch what a schema cannot: the int32 product bound must be the product of its
factors, checks must refer to thresholds that exist, the cells per layer must follow from the
fault list, both prediction matrices must cover every fault and match their declared counts,
the corrected matrix may differ from the original only in disclosed corrections, and the token
analysis must use the campaign's regimes, fit inside analysis.yaml's windows and predict every
injection cell exactly once; paper.yaml's stated definition must be the reading rule and its claims
must cite listed papers; ksweep.yaml's grid must ascend, its pairs must use arms of their format and
its models must include the null (constant) and the saturation model the paper selected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ProtocolError
from . import pins
from .matrix import SEVERITIES, FaultInfo, PredictionMatrix, parse_matrix, verify_corrections
from .schema import read_yaml, validate

if TYPE_CHECKING:  # only ``Protocol.matrix`` builds a table: loading and verifying need no pandas
    import pandas as pd

MatrixName = Literal["corrected", "original"]

_SCHEMAS = {
    pins.FAULTS: "faults.schema.yaml",
    pins.CHECKS: "checks.schema.yaml",
    pins.THRESHOLDS: "thresholds.schema.yaml",
    pins.ANALYSIS: "analysis.schema.yaml",
    pins.PREDICTIONS_ORIGINAL: "predictions.schema.yaml",
    pins.PREDICTIONS_CORRECTED: "predictions.schema.yaml",
    pins.TOKENS: "tokens.schema.yaml",
    pins.PAPER: "paper.schema.yaml",
    pins.KSWEEP: "ksweep.schema.yaml",
    pins.BATCH: "batch.schema.yaml",
}


@dataclass(frozen=True)
class Protocol:
    """The validated protocol. Mappings are the files' parsed content; matrices are verified."""

    root: Path
    faults: Mapping[str, Any]
    checks: Mapping[str, Any]
    thresholds: Mapping[str, Any]
    analysis: Mapping[str, Any]
    matrices: Mapping[str, PredictionMatrix]
    tokens: Mapping[str, Any]
    paper: Mapping[str, Any]
    ksweep: Mapping[str, Any]
    batch: Mapping[str, Any]

    def fault_info(self) -> dict[str, FaultInfo]:
        """Fault id -> the severities it runs (catalogue order) and whether it is a defect."""
        return _fault_info(self.faults)

    def matrix(self, which: MatrixName = "corrected") -> pd.DataFrame:
        """Predictions per campaign (fault, severity, check), ready for a single join.

        Columns: fault, severity, check, prediction, predicted_miss, corrected_post_data,
        original_prediction, row (the registered row the cell comes from).
        """
        return self._matrix(which).expand(self.fault_info())

    def counts(self, which: MatrixName = "corrected") -> dict[str, int]:
        """Registered cells of a matrix (63 original, 77 corrected in the study) by prediction."""
        return self._matrix(which).counts()

    def size_profile(self, name: str) -> dict[str, int]:
        """The run sizes of a named profile in analysis.yaml."""
        profiles = self.analysis["size_profiles"]
        if name not in profiles:
            raise ProtocolError(f"{pins.ANALYSIS}: no size profile {name!r} (defined: {sorted(profiles)})")
        return dict(profiles[name])

    def _matrix(self, which: str) -> PredictionMatrix:
        if which not in self.matrices:
            raise ProtocolError(f"prediction matrix {which!r} does not exist (expected 'corrected' or 'original')")
        return self.matrices[which]


def _fault_info(faults: Mapping[str, Any]) -> dict[str, FaultInfo]:
    return {
        f["id"]: FaultInfo(SEVERITIES if f["has_severities"] else ("all",), f["kind"] != "null")
        for f in faults["faults"]
    }


def _lookup(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _verify_thresholds(t: Mapping[str, Any]) -> None:
    i32 = t["int32"]
    product = i32["activation_abs_max"] * i32["weight_abs_max"]
    if i32["product_bound"] != product:
        raise ProtocolError(
            f"{pins.THRESHOLDS}: int32.product_bound is {i32['product_bound']}, but "
            f"activation_abs_max * weight_abs_max = {product}"
        )
    wq = t["weight_quantization"]
    if wq["division"] in wq["division_alternatives"]:
        raise ProtocolError(
            f"{pins.THRESHOLDS}: weight_quantization.division {wq['division']!r} is also listed as an alternative"
        )


def _verify_faults(f: Mapping[str, Any]) -> None:
    ids = [x["id"] for x in f["faults"]]
    expected = [f"F{i}" for i in range(1, len(ids) + 1)]
    if ids != expected:
        raise ProtocolError(f"{pins.FAULTS}: faults must be numbered F1..F{len(ids)} in order, found {ids}")
    for fault in f["faults"]:
        if fault["both_arms"] and fault["kind"] != "precondition":
            raise ProtocolError(f"{pins.FAULTS}: {fault['id']} applies to both arms but is not a precondition fault")
        if ("rungs" in fault) and not fault["has_severities"]:
            raise ProtocolError(f"{pins.FAULTS}: {fault['id']} describes rungs but has no severities")
    regimes = len(f["regimes"])
    cells = sum((len(SEVERITIES) if x["has_severities"] else 1) * regimes for x in f["faults"])
    if cells != f["cells_per_layer"]:
        raise ProtocolError(
            f"{pins.FAULTS}: cells_per_layer is {f['cells_per_layer']}, but the fault list gives {cells}"
        )


def _verify_checks(c: Mapping[str, Any], thresholds: Mapping[str, Any]) -> None:
    ids = [x["id"] for x in c["checks"]]
    if ids != list(range(1, len(ids) + 1)):
        raise ProtocolError(f"{pins.CHECKS}: checks must be numbered 1..{len(ids)} in order, found {ids}")
    for check in c["checks"]:
        for name in check["thresholds"]:
            try:
                _lookup(thresholds, name)
            except KeyError:
                raise ProtocolError(
                    f"{pins.CHECKS}: check {check['id']} uses threshold {name!r}, "
                    f"which {pins.THRESHOLDS} does not define"
                ) from None


def _verify_analysis(a: Mapping[str, Any], fault_ids: set[str]) -> None:
    for rule in a["decision_rules"]:
        unknown = sorted(set(rule["faults"]) - fault_ids)
        if unknown:
            raise ProtocolError(f"{pins.ANALYSIS}: decision rule {rule['id']} names unknown faults {unknown}")
    for name, profile in a["size_profiles"].items():
        if profile["prompts"] > len(a["prompts"]):
            raise ProtocolError(
                f"{pins.ANALYSIS}: size profile {name!r} asks for {profile['prompts']} prompts, but only "
                f"{len(a['prompts'])} are pinned"
            )
    for kind in ("hypotheses", "gates", "decision_rules"):
        ids = [x["id"] for x in a[kind]]
        if len(set(ids)) != len(ids):
            raise ProtocolError(f"{pins.ANALYSIS}: {kind} ids are not unique: {ids}")


def _verify_tokens(t: Mapping[str, Any], analysis: Mapping[str, Any], faults: Mapping[str, Any]) -> None:
    if set(t["regimes"]) != set(faults["regimes"]):
        raise ProtocolError(f"{pins.TOKENS}: regimes {sorted(t['regimes'])} are not faults.yaml's {sorted(faults['regimes'])}")
    cuts = analysis["size_profiles"]
    if set(t["size_profiles"]) != set(cuts):
        raise ProtocolError(f"{pins.TOKENS}: size profiles {sorted(t['size_profiles'])} are not analysis.yaml's "
                            f"{sorted(cuts)}")
    for name, p in t["size_profiles"].items():
        if p["replay_windows"] > cuts[name]["windows"] or p["replay_window_tokens"] > cuts[name]["window_tokens"]:
            raise ProtocolError(f"{pins.TOKENS}: size profile {name!r} replays {p['replay_windows']} windows of "
                                f"{p['replay_window_tokens']} tokens, more than analysis.yaml cuts "
                                f"({cuts[name]['windows']} of {cuts[name]['window_tokens']})")
        if p["injection_windows"] > p["replay_windows"]:
            raise ProtocolError(f"{pins.TOKENS}: size profile {name!r} injects into {p['injection_windows']} windows "
                                f"but replays only {p['replay_windows']}")
    entries = [*t["predictions"]["kernel_pair"].values(), *t["predictions"]["injection"]]
    for e in entries:
        if e["prediction"] == "fire" and (not e["observable"] or e.get("predicted_miss")):
            raise ProtocolError(f"{pins.TOKENS}: a prediction of fire must expect an observable comparison and no "
                                f"miss ({e.get('fault', 'kernel pair')} {e.get('severity', '')} {e.get('regime', '')})")
    keys = [(e["fault"], e["severity"], e["regime"]) for e in t["predictions"]["injection"]]
    wanted = {(f, s, r) for f, info in _fault_info(faults).items() for s in info.severities for r in t["regimes"]}
    duplicated = sorted({k for k in keys if keys.count(k) > 1})
    if duplicated or set(keys) != wanted:
        missing, unknown = sorted(wanted - set(keys)), sorted(set(keys) - wanted)
        raise ProtocolError(f"{pins.TOKENS}: injection predictions must name every (fault, severity, regime) of "
                            f"faults.yaml exactly once: missing {missing[:3]}, unknown {unknown[:3]}, "
                            f"repeated {duplicated[:3]}")


def _verify_paper(p: Mapping[str, Any]) -> None:
    from .definitions import STATED, Definition

    stated = Definition.from_protocol("stated", p["definitions"]["stated"], pins.PAPER)
    Definition.from_protocol("paper", p["definitions"]["paper"], pins.PAPER)
    if stated != STATED:
        raise ProtocolError(f"{pins.PAPER}: definition 'stated' must be analysis.yaml's reading rule "
                            f"({STATED.matrices}, {STATED.counted}, {STATED.check6}), found {stated}")
    ids = [c["id"] for c in p["claims"]]
    if len(set(ids)) != len(ids):
        raise ProtocolError(f"{pins.PAPER}: claim ids are not unique: {sorted({i for i in ids if ids.count(i) > 1})}")
    for claim in p["claims"]:
        if claim["paper"] not in p["papers"]:
            raise ProtocolError(f"{pins.PAPER}: claim {claim['id']} cites paper {claim['paper']!r}, "
                                f"which `papers` does not list")
        kind, deps = claim["kind"], set(claim.get("depends_on", ()))
        if kind not in p["verdict_rule"]["kinds"]:
            raise ProtocolError(f"{pins.PAPER}: claim {claim['id']} has kind {kind!r}, which verdict_rule does not list")
        if kind in ("structural", "empirical", "direction") and claim["unit"] not in ("verdict", "counts"):
            raise ProtocolError(f"{pins.PAPER}: {kind} claim {claim['id']} must have unit verdict or counts")
        if ("models" in claim) != bool(deps & {"model", "shape"}):
            raise ProtocolError(f"{pins.PAPER}: claim {claim['id']} must list `models` exactly when it depends on "
                                f"the model or its shapes")
        if (kind == "construction") != ("construction" in claim):
            raise ProtocolError(f"{pins.PAPER}: claim {claim['id']}: `construction` says why a construction claim "
                                f"holds, and only such a claim has it")


# Arms that take operands of each format (torch-scaled-mm, triton-fp8 and the vLLM kernels take
# e4m3; the project's own cublaslt and triton arms are int8 only).
KSWEEP_ARMS = {
    "int8": {"vllm-cutlass", "vllm-triton", "cublaslt", "triton"},
    "fp8": {"vllm-cutlass", "vllm-triton", "torch-scaled-mm", "triton-fp8"},
}


def _verify_ksweep(k: Mapping[str, Any]) -> None:
    grid = k["grid"]["k"]
    if list(grid) != sorted(grid):
        raise ProtocolError(f"{pins.KSWEEP}: grid.k must ascend, found {grid}")
    split = k["models"]["exponent_interval"]["half_split_k"]
    if split not in grid[1:-1]:
        raise ProtocolError(f"{pins.KSWEEP}: half_split_k {split} must be an inner point of grid.k {grid}")
    ids = [p["id"] for p in k["pairs"]]
    if len(set(ids)) != len(ids):
        raise ProtocolError(f"{pins.KSWEEP}: pair ids are not unique: {ids}")
    for pair in k["pairs"]:
        for arms in (pair["arms"], pair["fallback"] or []):
            wrong = sorted(set(arms) - KSWEEP_ARMS[pair["format"]])
            if wrong:
                raise ProtocolError(f"{pins.KSWEEP}: pair {pair['id']} ({pair['format']}) names arms {wrong} that "
                                    f"do not take {pair['format']} operands")
    if {p["format"] for p in k["pairs"]} != {"int8", "fp8"}:
        raise ProtocolError(f"{pins.KSWEEP}: pairs must cover both formats, int8 and fp8")
    bins = k["statistics"]["ulp_bins"]
    if bins[0] != 1 or list(bins) != sorted(bins):
        raise ProtocolError(f"{pins.KSWEEP}: statistics.ulp_bins must ascend from 1, found {bins}")
    models = [m["id"] for m in k["models"]["candidates"]]
    if len(set(models)) != len(models) or not {"constant", "generalized-saturation"} <= set(models):
        raise ProtocolError(f"{pins.KSWEEP}: models.candidates must be unique and include constant and "
                            f"generalized-saturation, found {models}")
    if k["paper"]["fp8"]["best_model"] not in models:
        raise ProtocolError(f"{pins.KSWEEP}: paper.fp8.best_model {k['paper']['fp8']['best_model']!r} is not a "
                            f"candidate model")
    order = k["paper"]["comparator"]["order"]
    for fmt in ("int8", "fp8"):
        registered = [p["id"] for p in k["pairs"] if p["format"] == fmt]
        if list(order[fmt]) != registered:
            raise ProtocolError(f"{pins.KSWEEP}: paper.comparator.order.{fmt} must list the {fmt} pairs in the "
                                f"registration order of `pairs` ({registered}), found {list(order[fmt])}")


def batch_prompts_needed(sizes: Mapping[str, Any]) -> int:
    """Prompts a batch.yaml sequence size profile generates: its prompts, with every batch size's
    last batch filled up to that size."""
    return max(-(-int(sizes["prompts"]) // n) * n for n in sizes["batch_sizes"])


def _verify_batch(b: Mapping[str, Any], analysis: Mapping[str, Any]) -> None:
    profiles = analysis["size_profiles"]
    for part in ("layer", "sequence"):
        named = b[part]["ms"] if part == "layer" else b[part]["size_profiles"]
        if set(named) != set(profiles):
            raise ProtocolError(f"{pins.BATCH}: {part} sizes name profiles {sorted(named)}, not analysis.yaml's "
                                f"{sorted(profiles)}")
    extra = sorted(set(b["layer"]["contrast_checkpoints"]) - set(b["layer"]["checkpoints"]))
    if extra:
        raise ProtocolError(f"{pins.BATCH}: layer.contrast_checkpoints {extra} are not among layer.checkpoints")
    for name, ms in b["layer"]["ms"].items():
        rows = profiles[name]["prefill_tokens"]
        if ms != sorted(ms) or ms[0] < 1 or ms[-1] > rows:
            raise ProtocolError(f"{pins.BATCH}: layer.ms.{name} must ascend from at least 1 to at most the "
                                f"profile's {rows} captured prefill rows, found {ms}")
    for name, seq in b["sequence"]["size_profiles"].items():
        needed = batch_prompts_needed(seq)
        if needed > len(analysis["prompts"]):
            raise ProtocolError(f"{pins.BATCH}: sequence.size_profiles.{name} needs {needed} prompts to fill its "
                                f"batches, but analysis.yaml pins {len(analysis['prompts'])}")


def load(root: Path = Path(pins.PROTOCOL_DIR)) -> Protocol:
    """Read, schema-validate and cross-check every protocol file under ``root`` (preregistration/)."""
    root = Path(root)
    data: dict[str, Any] = {}
    for rel, schema_name in _SCHEMAS.items():
        source = str(root / Path(rel).name)
        content = read_yaml(root / Path(rel).name, source)
        validate(content, schema_name, source)
        data[rel] = content
    _verify_thresholds(data[pins.THRESHOLDS])
    _verify_faults(data[pins.FAULTS])
    _verify_checks(data[pins.CHECKS], data[pins.THRESHOLDS])
    faults = data[pins.FAULTS]
    _verify_analysis(data[pins.ANALYSIS], {f["id"] for f in faults["faults"]})

    info = _fault_info(faults)
    checks = data[pins.CHECKS]["checks"]
    layer_na = [c["id"] for c in checks if c["applicable"] == "not_at_layer_level"]
    matrices: dict[str, PredictionMatrix] = {}
    for rel, name in ((pins.PREDICTIONS_ORIGINAL, "original"), (pins.PREDICTIONS_CORRECTED, "corrected")):
        source = str(root / Path(rel).name)
        if data[rel]["matrix"] != name:
            raise ProtocolError(f"{source}: declares matrix {data[rel]['matrix']!r}, expected {name!r} for this file")
        matrices[name] = parse_matrix(data[rel], source, info, layer_na, len(checks))
    verify_corrections(matrices["original"], matrices["corrected"])
    _verify_tokens(data[pins.TOKENS], data[pins.ANALYSIS], faults)
    _verify_paper(data[pins.PAPER])
    _verify_ksweep(data[pins.KSWEEP])
    _verify_batch(data[pins.BATCH], data[pins.ANALYSIS])
    return Protocol(
        root=root,
        faults=faults,
        checks=data[pins.CHECKS],
        thresholds=data[pins.THRESHOLDS],
        analysis=data[pins.ANALYSIS],
        matrices=matrices,
        tokens=data[pins.TOKENS],
        paper=data[pins.PAPER],
        ksweep=data[pins.KSWEEP],
        batch=data[pins.BATCH],
    )

"""The protocol files load, validate and say what the study registered; bad files are named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from int8alibi.errors import ProtocolError
from int8alibi.protocol import PROTOCOL_FILES, STAGE_FILES, Protocol, load
from int8alibi.protocol.schema import SCHEMA_DIR

from .conftest import PROJECT

CAMPAIGN_ROWS = (5 * 3 + 3 * 1 + 1 * 3) * 7  # (fault, severity) pairs the campaign runs x 7 checks


@pytest.fixture(scope="module")
def protocol() -> Protocol:
    return load(PROJECT / "preregistration")


def _cells(protocol: Protocol, which: str, column: str) -> set[tuple[str, str, int]]:
    frame = protocol.matrix(which)
    hit = frame[frame[column]]
    return {(f, s, int(c)) for f, s, c in zip(hit["fault"], hit["severity"], hit["check"])}


def test_registered_counts(protocol: Protocol) -> None:
    assert protocol.counts("original") == {"cells": 63, "fire": 8, "silent": 46, "n/a": 9, "predicted_miss": 5}
    assert protocol.counts("corrected") == {"cells": 77, "fire": 14, "silent": 52, "n/a": 11, "predicted_miss": 6}


def test_counts_follow_from_the_expanded_matrix(protocol: Protocol) -> None:
    """Deduplicating the join-ready frame by its registered row gives the registered cells back."""
    for which, cells in (("original", 63), ("corrected", 77)):
        frame = protocol.matrix(which)
        registered = frame.drop_duplicates(["row", "check"])
        assert len(registered) == cells
        assert len(frame) == CAMPAIGN_ROWS
        assert not frame.duplicated(["fault", "severity", "check"]).any()


def test_original_f9_row_is_expanded_to_every_rung(protocol: Protocol) -> None:
    frame = protocol.matrix("original")
    f9 = frame[frame["fault"] == "F9"]
    assert sorted(set(f9["severity"])) == ["all", "one", "pct"]
    by_rung = {s: list(g.sort_values("check")["prediction"]) for s, g in f9.groupby("severity")}
    assert (
        by_rung["one"]
        == by_rung["pct"]
        == by_rung["all"]
        == ["fire", "silent", "silent", "fire", "fire", "fire", "n/a"]
    )
    assert set(frame.loc[frame["fault"].isin(["F6", "F7", "F8"]), "severity"]) == {"all"}


def test_matrices_differ_exactly_in_f4_check5_and_the_f9_pct_rung(protocol: Protocol) -> None:
    key = ["fault", "severity", "check"]
    both = protocol.matrix("corrected").merge(protocol.matrix("original"), on=key, suffixes=("", "_orig"))
    diff = both[both["prediction"] != both["prediction_orig"]]
    found = {(f, s, int(c)) for f, s, c in zip(diff["fault"], diff["severity"], diff["check"])}
    assert found == {("F4", s, 5) for s in ("one", "pct", "all")} | {("F9", "pct", c) for c in (4, 5, 6)}


def test_post_data_corrections_are_flagged_with_their_earlier_prediction(protocol: Protocol) -> None:
    cells = protocol.matrices["corrected"].cells
    flagged = cells[cells["corrected_post_data"]]
    got = {
        (r, int(c), o, p)
        for r, c, o, p in zip(flagged["row"], flagged["check"], flagged["original_prediction"], flagged["prediction"])
    }
    assert got == {("F4", 5, "silent", "fire"), ("F9 one", 6, "silent", "fire"), ("F9 pct", 4, "fire", "silent")}
    assert not protocol.matrices["original"].cells["corrected_post_data"].any()


def test_predicted_misses(protocol: Protocol) -> None:
    original = {("F1", 6), ("F2", 6), ("F4", 6), ("F5", 6), ("F6", 5)}
    cells = protocol.matrices["original"].cells
    assert {
        (r, int(c))
        for r, c in zip(cells.loc[cells["predicted_miss"], "row"], cells.loc[cells["predicted_miss"], "check"])
    } == original
    cells = protocol.matrices["corrected"].cells
    assert {
        (r, int(c))
        for r, c in zip(cells.loc[cells["predicted_miss"], "row"], cells.loc[cells["predicted_miss"], "check"])
    } == original | {("F9 pct", 6)}
    assert ("F9", "pct", 6) in _cells(protocol, "corrected", "predicted_miss")


def test_catalogues(protocol: Protocol) -> None:
    info = protocol.fault_info()
    assert list(info) == [f"F{i}" for i in range(1, 10)]
    assert sum(len(i.severities) for i in info.values()) * len(protocol.faults["regimes"]) == 42
    assert protocol.faults["cells_per_layer"] == 42
    # Amendable values, compared with the file as written (an amendment changes both, never this test).
    written = yaml.safe_load((PROJECT / "preregistration" / "faults.yaml").read_text(encoding="utf-8"))
    f5 = next(f for f in protocol.faults["faults"] if f["id"] == "F5")
    written_f5 = next(f for f in written["faults"] if f["id"] == "F5")
    assert f5["params"] == written_f5["params"] and type(f5["params"]["tile_width"]) is int
    assert f5["params"]["tile_width"] >= 1
    assert protocol.faults["severities"]["pct"] == written["severities"]["pct"]
    assert 0 < protocol.faults["severities"]["pct"]["fraction"] < 1
    both = sorted(f["id"] for f in protocol.faults["faults"] if f["both_arms"])
    assert both == ["F6", "F7"]
    applicable = {c["id"]: c["applicable"] for c in protocol.checks["checks"]}
    assert applicable == {
        1: "always",
        2: "always",
        3: "always",
        4: "always",
        5: "all_scales_pow2",
        6: "real_scales",
        7: "not_at_layer_level",
    }


def test_thresholds_agree_with_the_arithmetic_module(protocol: Protocol) -> None:
    from int8alibi.arith import F32_EXACT_BOUND, INT32_PRODUCT_BOUND

    t = protocol.thresholds
    assert t["int32"]["product_bound"] == INT32_PRODUCT_BOUND == 16256
    assert t["f32_exact_bound"] == F32_EXACT_BOUND == 2**24
    assert t["int32"]["limit"] == 2**31
    assert t["ulp_tolerance"] == 1
    assert t["weight_quantization"]["division"] == "bf16"
    assert t["weight_quantization"]["division_alternatives"] == ["float32"]


def test_size_profiles(protocol: Protocol) -> None:
    assert protocol.size_profile("study") == {
        "prefill_tokens": 512,
        "decode_tokens": 1,
        "prompts": 8,
        "new_tokens": 64,
        "windows": 40,
        "window_tokens": 2048,
    }
    cpu, tiny = protocol.size_profile("default-cpu"), protocol.size_profile("tiny")
    for key in ("prefill_tokens", "prompts", "new_tokens", "windows", "window_tokens"):
        assert tiny[key] <= cpu[key] < protocol.size_profile("study")[key]
    with pytest.raises(ProtocolError, match="analysis.yaml: no size profile 'huge'"):
        protocol.size_profile("huge")


def test_stage_files_name_protocol_files_and_match_the_amendment_schema() -> None:
    names = {Path(f).name for f in PROTOCOL_FILES}
    assert set(STAGE_FILES["protocol"]) == names
    for stage, files in STAGE_FILES.items():
        assert set(files) <= names, stage
    schema = yaml.safe_load((SCHEMA_DIR / "amendment.schema.yaml").read_text())
    assert set(schema["properties"]["stages"]["items"]["enum"]) == set(STAGE_FILES)
    # the layer-level campaign reads all but the token analysis and the K sweep
    assert set(STAGE_FILES["faults"]) == names - {"tokens.yaml", "ksweep.yaml", "batch.yaml"}


# --- malformed files: each error names the file and the reason --------------------------------


@pytest.fixture
def prereg(tmp_path: Path) -> Path:
    dest = tmp_path / "preregistration"
    shutil.copytree(PROJECT / "preregistration", dest)
    return dest


def _edit(path: Path, old: str | tuple[str, ...], new: str | tuple[str, ...]) -> None:
    """Replace each ``old`` text by its ``new`` counterpart, once; every ``old`` must be present."""
    text = path.read_text()
    for before, after in zip((old,) if isinstance(old, str) else old, (new,) if isinstance(new, str) else new):
        assert before in text, f"{before!r} not in {path.name}"
        text = text.replace(before, after, 1)
    path.write_text(text)


@pytest.mark.parametrize(
    ("name", "old", "new", "message"),
    [
        (
            "faults.yaml",
            "tile_width: 128",
            "tile_width: wide",
            r"faults\.yaml: does not match .* at faults/4/params/tile_width",
        ),
        (
            "faults.yaml",
            "cells_per_layer: 42",
            "cells_per_layer: 40",
            r"faults\.yaml: cells_per_layer is 40, but the fault list gives 42",
        ),
        ("faults.yaml", "  - id: F2\n", "  - id: F12\n", r"faults\.yaml: faults must be numbered F1\.\.F9"),
        (
            "checks.yaml",
            "applicable: real_scales",
            "applicable: sometimes",
            r"checks\.yaml: does not match .* at checks/5/applicable",
        ),
        (
            "checks.yaml",
            "thresholds: [ulp_tolerance]",
            "thresholds: [ulp_tolerence]",
            r"checks\.yaml: check 6 uses threshold 'ulp_tolerence'",
        ),
        (
            "thresholds.yaml",
            "product_bound: 16256",
            "product_bound: 16384",
            r"thresholds\.yaml: int32\.product_bound is 16384",
        ),
        (
            "thresholds.yaml",
            "f32_exact_bound: 16777216",
            "f32_exact_bound: 33554432",
            r"thresholds\.yaml: does not match .* at f32_exact_bound",
        ),
        (
            "thresholds.yaml",
            "ulp_tolerance: 1\n",
            "ulp_tolerance: 1\nulp_tolerance: 2\n",
            r"thresholds\.yaml: not valid YAML: .*duplicate key 'ulp_tolerance'",
        ),
        ("analysis.yaml", "level: 0.90", "level: [0.90", r"analysis\.yaml: not valid YAML"),
        (
            "analysis.yaml",
            "    prompts: 8\n",
            "    prompts: 9\n",
            r"analysis\.yaml: size profile 'study' asks for 9 prompts",
        ),
        (
            "analysis.yaml",
            "faults: [F1, F2, F3, F4, F5]",
            "faults: [F1, F2, F3, F4, F10]",
            r"analysis\.yaml: decision rule D1 names unknown faults \['F10'\]",
        ),
        (
            "predictions-original.yaml",
            "  fire: 8\n",
            "  fire: 9\n",
            r"predictions-original\.yaml: declared counts .* do not match the rows",
        ),
        (
            "predictions-original.yaml",
            "matrix: original",
            "matrix: corrected",
            r"predictions-original\.yaml: declares matrix 'corrected'",
        ),
        (
            "predictions-original.yaml",
            "  - fault: F9\n",
            "  - fault: F9\n    severity: all\n",
            r"predictions-original\.yaml: does not match .* at rows/8",
        ),
        (
            "predictions-corrected.yaml",
            "    original_prediction: fire",
            "    original_prediction: silent",
            r"predictions-corrected\.yaml: row 10 \(F9 pct\): check 4 is flagged corrected_post_data but its "
            r"prediction is unchanged",
        ),
        (
            "predictions-corrected.yaml",
            "        original_prediction: silent\n        reason: >-\n          A power",
            "        original_prediction: n/a\n        reason: >-\n          A power",
            r"predictions-corrected\.yaml: F4 check 5 says its original prediction was 'n/a', "
            r"but .*predictions-original\.yaml registered 'silent'",
        ),
        (
            "predictions-corrected.yaml",
            ("  - fault: F3\n    predictions: [silent", "  fire: 14\n  silent: 52\n"),
            ("  - fault: F3\n    predictions: [fire", "  fire: 15\n  silent: 51\n"),
            r"predictions-corrected\.yaml: F3 check 1 differs from .*without a corrected_post_data disclosure",
        ),
        (
            "predictions-corrected.yaml",
            "  - fault: F8\n    predictions: [silent, silent, silent, silent, silent, silent, n/a]",
            "  - fault: F8\n    predictions: [silent, silent, silent, silent, silent, silent, silent]",
            r"predictions-corrected\.yaml: row 7 \(F8\): check 7 never applies at layer level",
        ),
        (
            "predictions-corrected.yaml",
            "    severity: pct\n",
            "    severity: one\n",
            r"predictions-corrected\.yaml: fault F9 must have exactly one row, or exactly one row per severity",
        ),
        (
            "predictions-corrected.yaml",
            "  - fault: F7\n    predictions: [silent, silent, fire",
            "  - fault: F7\n    predicted_misses: [{check: 3, reason: x}]\n    predictions: [silent, silent, fire",
            r"predictions-corrected\.yaml: row 6 \(F7\): check 3 is a predicted miss but is predicted 'fire'",
        ),
        (
            "predictions-corrected.yaml",
            "  - fault: F8\n",
            "  - fault: F8\n    predicted_misses: [{check: 1, reason: x}]\n",
            r"needs a real defect, and F8 injects none",
        ),
    ],
)
def test_malformed_file_is_named_with_the_reason(
    prereg: Path, name: str, old: str | tuple[str, ...], new: str | tuple[str, ...], message: str
) -> None:
    _edit(prereg / name, old, new)
    with pytest.raises(ProtocolError, match=message):
        load(prereg)


def test_missing_file_is_named(prereg: Path) -> None:
    (prereg / "checks.yaml").unlink()
    with pytest.raises(ProtocolError, match=r"checks\.yaml: file not found"):
        load(prereg)


# The study's two registered matrices as arXiv:2609.00363 (Table III) states them,
# row by row: F fire, s silent, m predicted miss (silent), - n/a.
STUDY_CORRECTED = {
    "F1": "sssssm-",
    "F2": "sssssm-",
    "F3": "ssssss-",
    "F4": "ssssFm-",
    "F5": "sssssm-",
    "F6": "sFFFms-",
    "F7": "ssFsss-",
    "F8": "ssssss-",
    "F9 all": "FssFFF-",
    "F9 one": "FssFFF-",
    "F9 pct": "Fssssm-",
}
STUDY_ORIGINAL = {
    **{k: v for k, v in STUDY_CORRECTED.items() if not k.startswith("F9")},
    "F4": "sssssm-",
    "F9": "FssFFF-",
}
_CODE = {"F": ("fire", False), "s": ("silent", False), "m": ("silent", True), "-": ("n/a", False)}


@pytest.mark.parametrize(("which", "table"), [("corrected", STUDY_CORRECTED), ("original", STUDY_ORIGINAL)])
def test_every_registered_cell_matches_the_study_table(protocol: Protocol, which: str, table: dict[str, str]) -> None:
    cells = protocol.matrices[which].cells
    got = {
        (row, int(check)): (prediction, bool(miss))
        for row, check, prediction, miss in zip(
            cells["row"], cells["check"], cells["prediction"], cells["predicted_miss"]
        )
    }
    expected = {(row, i + 1): _CODE[code] for row, codes in table.items() for i, code in enumerate(codes)}
    assert got == expected

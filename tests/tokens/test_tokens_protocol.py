"""preregistration/tokens.yaml: loaded, schema-validated and cross-checked; each defect is named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from int8alibi.errors import ProtocolError
from int8alibi.protocol import STAGE_FILES, load

ROOT = Path(__file__).resolve().parents[2]


def test_the_pinned_file_covers_every_injection_cell_once() -> None:
    protocol = load(ROOT / "preregistration")
    tokens = protocol.tokens
    keys = [(e["fault"], e["severity"], e["regime"]) for e in tokens["predictions"]["injection"]]
    expected = {(f, s, r) for f, info in protocol.fault_info().items() for s in info.severities for r in ("own", "pow2")}
    assert len(keys) == len(set(keys)) == 42 and set(keys) == expected
    assert set(tokens["size_profiles"]) == set(protocol.analysis["size_profiles"])
    assert STAGE_FILES["tokens"] == ["analysis.yaml", "faults.yaml", "thresholds.yaml", "tokens.yaml"]


@pytest.fixture
def prereg(tmp_path: Path) -> Path:
    dest = tmp_path / "preregistration"
    shutil.copytree(ROOT / "preregistration", dest)
    return dest


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(("old", "new", "message"), [
    ("    - {fault: F1, severity: one, regime: own,", "    - {fault: F1, severity: pct, regime: own,",
     r"tokens\.yaml: injection predictions must name every .* missing \[\('F1', 'one', 'own'\)\].* repeated "
     r"\[\('F1', 'pct', 'own'\)\]"),
    ("    replay_windows: 8\n    replay_window_tokens: 48\n    injection_windows: 2",
     "    replay_windows: 8\n    replay_window_tokens: 48\n    injection_windows: 9",
     r"tokens\.yaml: size profile 'default-cpu' injects into 9 windows but replays only 8"),
    ("    replay_windows: 8\n    replay_window_tokens: 48", "    replay_windows: 8\n    replay_window_tokens: 257",
     r"tokens\.yaml: size profile 'default-cpu' replays 8 windows of 257 tokens, more than analysis\.yaml cuts"),
    ("{fault: F8, severity: all, regime: own, prediction: silent",
     "{fault: F8, severity: all, regime: own, prediction: fire",
     r"tokens\.yaml: a prediction of fire must expect an observable comparison and no miss \(F8 all own\)"),
    ("  flip_budget: ", "  flip_budget: 1.5  # was ",  # whatever value is pinned now
     r"tokens\.yaml: does not match tokens\.schema\.yaml at check7/flip_budget"),
    ("  pow2: pow2-nearest\n\nreplay:", "  pow2: pow2-nearest\n  extra: own\n\nreplay:",
     r"tokens\.yaml: does not match tokens\.schema\.yaml at regimes"),
])
def test_defects_are_named(prereg: Path, old: str, new: str, message: str) -> None:
    _edit(prereg / "tokens.yaml", old, new)
    with pytest.raises(ProtocolError, match=message):
        load(prereg)


def test_a_missing_tokens_file_is_named(prereg: Path) -> None:
    (prereg / "tokens.yaml").unlink()
    with pytest.raises(ProtocolError, match=r"tokens\.yaml: file not found"):
        load(prereg)

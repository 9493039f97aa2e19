"""The cross-model view's refusals (the full target runs on two tiny configs in tests/workflow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from int8alibi.crossmodel import check_run, gather
from int8alibi.errors import InputError
from int8alibi.protocol import load

PROTOCOL = load(Path(__file__).resolve().parents[1] / "preregistration")


def test_an_unfinished_run_folder_is_refused_by_name(tmp_path: Path) -> None:
    run = tmp_path / "qwen3-8b"
    (run / ".run" / "0123456789abcdef").mkdir(parents=True)
    (run / ".run" / "0123456789abcdef" / "config.yaml").write_text("{}")
    (run / ".run" / "current").write_text("0123456789abcdef/config.yaml\n")
    with pytest.raises(InputError, match=r"qwen3-8b: not a finished run \(report/manifest.json is missing\)"):
        check_run(run)


def test_needs_two_distinct_runs(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="at least two"):
        gather([tmp_path / "a"], PROTOCOL)
    with pytest.raises(InputError, match="must differ"):
        gather([tmp_path / "x" / "a", tmp_path / "y" / "a"], PROTOCOL)


def test_a_run_folder_without_a_run_config_is_refused_by_name(tmp_path: Path) -> None:
    run = tmp_path / "qwen3-8b"
    (run / "report").mkdir(parents=True)
    (run / "report" / "manifest.json").write_text("{}")
    with pytest.raises(InputError, match=r"qwen3-8b: not a finished run \(.run/current is missing\)"):
        check_run(run)

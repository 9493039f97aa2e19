"""The cross-model view's refusals (the full target runs on two tiny configs in tests/workflow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from int8alibi.report.crossmodel import check_run, gather
from int8alibi.errors import InputError
from int8alibi.protocol import load

PROTOCOL = load(Path(__file__).resolve().parents[2] / "preregistration")


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


def test_a_run_whose_table_was_edited_is_refused_before_it_is_read(tmp_path: Path, monkeypatch) -> None:
    """crossmodel verifies each run folder (as ``int8alibi verify`` does) before reading a table."""
    import pandas as pd
    import pyarrow as pa

    from int8alibi.report.crossmodel import verified_root
    from int8alibi.provenance.manifest import write_manifest
    from int8alibi.provenance.parquet import write_table

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    run = tmp_path / "qwen3-8b"
    (run / "report").mkdir(parents=True)
    table = write_table(pd.DataFrame({"value": [1.5]}), run / "report" / "t.parquet",
                        pa.schema([("value", pa.float64())]), ["value"])
    write_manifest(run / "report", stage="report", outputs=[table], inputs=[], params={},
                   protocol_root=root / "preregistration")
    assert len(verified_root(run)) == 64
    write_table(pd.DataFrame({"value": [9.5]}), table, pa.schema([("value", pa.float64())]), ["value"])
    with pytest.raises(InputError, match=r"qwen3-8b: does not verify: .*t\.parquet.*sha256 changed"):
        verified_root(run)

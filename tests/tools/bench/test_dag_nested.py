"""bench dag on the default run ``results`` beside a second config's run in ``results/other``: the other
run's ``benchmarks/other`` and ``logs/other`` are not a stage of the default run, and its seconds are not
added to the default run's sum."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from int8alibi.runtime.device_memory import PREFIX
from int8alibi.tools.bench import dag
from .test_bench_dag import PARENT, _tsv

CHECKOUT = Path(__file__).resolve().parents[3]


def _run(results: Path) -> None:
    (results / ".run" / "0123456789abcdef").mkdir(parents=True)
    (results / ".run" / "0123456789abcdef" / "config.yaml").write_text(yaml.safe_dump(
        {"model": {"source": "hf", "parent": "/nowhere"}, "size_profile": "tiny", "resolved": {"device": "cpu"}}))
    (results / ".run" / "current").write_text("0123456789abcdef/config.yaml\n")
    (results / "model" / "parent").mkdir(parents=True)
    (results / "model" / "parent" / "config.json").write_text(json.dumps(PARENT))


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    _run(tmp_path / "results")
    _run(tmp_path / "results" / "other")
    _tsv(tmp_path / "benchmarks" / "model.tsv", ("2", "100"))
    _tsv(tmp_path / "benchmarks" / "generate" / "a_own_1.tsv", ("3", "200"))
    _tsv(tmp_path / "benchmarks" / "other" / "model.tsv", ("500", "9000"))       # the other run's
    _tsv(tmp_path / "benchmarks" / "other" / "generate" / "a_own_1.tsv", ("700", "9000"))
    logs = tmp_path / "logs" / "other" / "generate"
    logs.mkdir(parents=True)
    (logs / "a_own_1.log").write_text(f"x INFO {PREFIX} peak_allocated_bytes=1 peak_reserved_bytes={9 << 20} "
                                      "device=H200\n")
    return tmp_path


def test_the_other_runs_benchmarks_are_no_stage_of_this_one(checkout: Path) -> None:
    runs = dag.read_benchmarks(checkout / "benchmarks")
    assert runs == {"model": dag.StageRun(1, 2.0, 100.0), "generate": dag.StageRun(1, 3.0, 200.0)}
    assert dag.read_device_peaks(checkout / "logs") == {}
    assert dag.other_runs(checkout / "benchmarks") == [checkout / "benchmarks" / "other"]


def test_main_leaves_the_other_run_out_and_says_so(checkout: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(checkout)
    assert dag.main(["results", "--protocol", str(CHECKOUT / "preregistration")]) == 0
    out = capsys.readouterr().out
    assert "| other |" not in out and "Sum of job seconds: 5.0 " in out
    assert "left out: benchmarks/other, logs/other (named after no stage" in out
    assert dag.main(["results/other", "--protocol", str(CHECKOUT / "preregistration")]) == 0
    assert "Sum of job seconds: 1200.0 " in capsys.readouterr().out    # that run, on its own

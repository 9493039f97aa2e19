"""The device study drives the DAG's own rules with vLLM's engine (a dry run, with and without vLLM
where the run is planned), and copies one vLLM log per arm for the fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from int8alibi.tools import vllm_study

PROJECT = Path(__file__).resolve().parents[2]
CONFIG = PROJECT / "config" / "synthetic-qwen3-1.7b.yaml"


def _dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vllm: bool) -> int:
    """The study's Snakemake dry run from the project root, vLLM findable (an empty package) or not."""
    monkeypatch.chdir(PROJECT)
    paths = [str(PROJECT / "workflow"), os.environ.get("PYTHONPATH", "")]
    if vllm:
        (tmp_path / "site" / "vllm").mkdir(parents=True)
        (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
        paths.insert(0, str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    return vllm_study.main(["--config", str(CONFIG), "--results-root", str(tmp_path / "out"), "--results", "study",
                            "--", "-n"])


@pytest.mark.slow
def test_the_study_is_the_dags_determinism_target_on_vllms_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    assert _dry_run(tmp_path, monkeypatch, vllm=True) == 0
    out = capfd.readouterr().out
    jobs = dict(line.split() for line in out.splitlines()
                if line.split()[:1] in (["model"], ["reference_checkpoint"], ["requant"], ["generate"],
                                        ["determinism"], ["total"]) and len(line.split()) == 2)
    assert jobs == {"model": "1", "reference_checkpoint": "1", "requant": "1", "generate": "16", "determinism": "1",
                    "total": "20"}
    assert out.count("--param engine=vllm") == 16
    assert all(f"--param arm={arm}" in out for arm in vllm_study.ARMS)
    assert not (tmp_path / "out" / "study" / "determinism").exists()  # a dry run writes no stage output


@pytest.mark.slow
def test_without_vllm_the_study_is_refused_at_planning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    assert _dry_run(tmp_path, monkeypatch, vllm=False) == 1
    captured = capfd.readouterr()
    assert "vLLM cannot be imported" in captured.out + captured.err
    assert "snakemake failed" in captured.err


def test_one_vllm_log_per_arm_is_copied_for_the_fixtures(tmp_path: Path) -> None:
    for arm in vllm_study.ARMS:
        log = tmp_path / "r" / "determinism" / "runs" / arm / "own" / "run1" / "vllm" / f"{arm}.vllm.log"
        log.parent.mkdir(parents=True)
        log.write_text(f"log of {arm}\n")
    copied = vllm_study.copy_logs(tmp_path / "r", tmp_path / "fixtures")
    assert [p.name for p in copied] == ["vllm-cutlass.vllm.log", "vllm-triton.vllm.log"]
    assert (tmp_path / "fixtures" / "vllm-triton.vllm.log").read_text() == "log of vllm-triton\n"

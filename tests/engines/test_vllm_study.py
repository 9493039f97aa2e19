"""The device study's planning and log copy (its stages are the pipeline's own, tested there)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from int8alibi.planning import resolve
from int8alibi.engines import vllm_study
from int8alibi.errors import InputError

PROJECT = Path(__file__).resolve().parents[2]


def test_the_run_config_is_planned_for_the_vllm_pair_on_vllms_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(resolve, "vllm_importable", lambda: True)
    path = vllm_study.plan_run_config(PROJECT / "config" / "synthetic-qwen3-1.7b.yaml", "results/study")
    run = yaml.safe_load(path.read_text())
    assert path.parent.parent == Path("results/study/.run")
    assert run["resolved"]["arms"] == ["vllm-cutlass", "vllm-triton"] and run["resolved"]["engine"] == "vllm"
    assert run["resolved"]["device"] == "cuda" and run["model"]["synthetic"]["preset"] == "qwen3-1.7b"
    assert vllm_study.plan_run_config(PROJECT / "config" / "synthetic-qwen3-1.7b.yaml", "results/study") == path


def test_without_vllm_the_study_is_refused_at_planning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(resolve, "vllm_importable", lambda: False)
    with pytest.raises(InputError, match="vLLM cannot be imported"):
        vllm_study.plan_run_config(PROJECT / "config" / "synthetic-qwen3-1.7b.yaml", "results/study")
    assert vllm_study.main(["--config", str(PROJECT / "config" / "synthetic-qwen3-1.7b.yaml"),
                            "--results", "results/study"]) == 1


def test_one_vllm_log_per_arm_is_copied_for_the_fixtures(tmp_path: Path) -> None:
    for arm in vllm_study.ARMS:
        log = tmp_path / "r" / "determinism" / "runs" / arm / "own" / "run1" / "vllm" / f"{arm}.vllm.log"
        log.parent.mkdir(parents=True)
        log.write_text(f"log of {arm}\n")
    copied = vllm_study.copy_logs(tmp_path / "r", tmp_path / "fixtures")
    assert [p.name for p in copied] == ["vllm-cutlass.vllm.log", "vllm-triton.vllm.log"]
    assert (tmp_path / "fixtures" / "vllm-triton.vllm.log").read_text() == "log of vllm-triton\n"

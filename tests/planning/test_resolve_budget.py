"""The device-memory budget is decided once when a run is planned and recorded in the run config's
resolved block: auto is device 0's free memory on a CUDA run, not applicable on a CPU run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from int8alibi.config import RESOLVED, load_config, validate
from int8alibi.hardware import ENV, Device, Hardware
from int8alibi.planning import resolve

from .test_resolve import EXACT, user_config, write_run_config

CARD = Hardware(16, (Device("NVIDIA A100-SXM4-80GB", 81920, 80100),), "faked")


def test_auto_on_cuda_is_the_free_memory_of_device_0() -> None:
    got = resolve.resolve_budget("auto", "cuda", CARD)
    assert got["mb"] == 80100 and got["spec"] == "auto"
    assert "NVIDIA A100-SXM4-80GB" in got["reason"] and "faked" in got["reason"]


def test_auto_on_cpu_is_not_applicable_and_a_named_budget_bounds_host_memory() -> None:
    assert resolve.resolve_budget("auto", "cpu", CARD) == {
        "spec": "auto", "mb": None, "reason": "not applicable: device cpu (the budget bounds CUDA device memory)"}
    named = resolve.resolve_budget(512, "cpu", CARD)
    assert named["mb"] == 512 and "host memory" in named["reason"]
    assert resolve.resolve_budget(20000, "cuda", CARD)["mb"] == 20000  # a named budget is taken as named


def test_a_cuda_run_planned_where_no_gpu_is_seen_has_no_budget() -> None:
    got = resolve.resolve_budget("auto", "cuda", Hardware(4, (), "faked"))
    assert got["mb"] is None and "no CUDA device visible" in got["reason"] and "gpu_budget_mb" in got["reason"]


def test_the_plan_records_the_budget_and_reuses_it_for_the_same_value(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, json.dumps({"cores": 8, "devices": [
        {"name": "NVIDIA GeForce RTX 4090", "total_mb": 24564, "free_mb": 23000}]}))
    config = user_config(tmp_path, device="cuda", arms=EXACT)
    run = resolve.plan(config)
    assert run[RESOLVED]["gpu_budget"]["mb"] == 23000
    validate(run, "run config")
    path = write_run_config(tmp_path, run)
    assert load_config(path).gpu_budget_bytes == 23000 << 20
    monkeypatch.setenv(ENV, json.dumps({"cores": 8, "devices": [
        {"name": "NVIDIA GeForce RTX 4090", "total_mb": 24564, "free_mb": 9000}]}))
    assert resolve.plan(config, run)[RESOLVED]["gpu_budget"]["mb"] == 23000  # decided once, not again
    named = resolve.plan({**config, "gpu_budget_mb": 12000}, run)[RESOLVED]
    assert named["gpu_budget"]["mb"] == 12000 and named["arms"] == EXACT  # a new value is decided anew


def test_a_run_config_written_before_budgets_is_kept_as_written(tmp_path: Path) -> None:
    config = user_config(tmp_path, device="cpu", arms=EXACT)
    earlier = resolve.plan(config)
    old = {**earlier, RESOLVED: {k: v for k, v in earlier[RESOLVED].items() if k != "gpu_budget"}}
    assert resolve.plan(config, old) == old  # its own file: written once, never rewritten
    assert "gpu_budget" in resolve.plan({**config, "size_profile": "default-cpu"}, old)[RESOLVED]
    cfg = load_config(write_run_config(tmp_path, old))
    assert cfg.gpu_budget_bytes is None

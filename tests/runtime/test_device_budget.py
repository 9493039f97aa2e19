"""A GPU stage of a CUDA run holds its CUDA allocator to the run's budget (runtime.device_memory.cap_to_budget),
read by the runner from the run config; a CPU stage, a CPU run or a run without a budget is left alone."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import yaml

from int8alibi.config import load_config
from int8alibi.hardware import ENV
from int8alibi.planning.resolve import plan
from int8alibi.runtime import device_memory
from int8alibi.runtime.runner import _device_budget

ROOT = Path(__file__).resolve().parents[2]


def _run_config(tmp_path: Path, monkeypatch, device: str, budget_mb: int | None) -> Path:
    """A run config as planning writes it, on a faked host with one 80 GiB card."""
    monkeypatch.setenv(ENV, '{"cores": 4, "devices": [{"name": "fake", "total_mb": 81920, "free_mb": 81000}]}')
    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    data.update(device=device, arms=["exact-cutlass-order", "exact-triton-order"])
    if budget_mb is not None:
        data["gpu_budget_mb"] = budget_mb
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(plan(data)))
    return path


@pytest.mark.parametrize("stage, device, budget, expected", [
    ("tokens", "cuda", 24_000, 24_000 << 20),
    ("ksweep", "cuda", 256, 256 << 20),  # the smallest budget the schema takes is still a cap
    ("tokens", "cuda", None, 81_000 << 20),  # auto: the free memory of device 0 when planned
    ("tokens", "cpu", 24_000, None),  # a CPU run's budget bounds host structures, not a device
    ("reference", "cuda", 24_000, None),  # not a GPU stage: it must not touch CUDA at all
    ("report", "cuda", 24_000, None),
])
def test_the_runner_reads_the_budget_only_for_a_gpu_stage_of_a_cuda_run(tmp_path, monkeypatch, stage, device, budget, expected):
    assert _device_budget(stage, load_config(_run_config(tmp_path, monkeypatch, device, budget))) == expected


def test_a_user_config_without_a_resolved_block_is_not_capped():
    assert _device_budget("tokens", load_config(ROOT / "config" / "config.yaml")) is None


def test_the_cap_is_the_budget_as_a_fraction_of_the_device(monkeypatch, caplog):
    calls: list[tuple[float, int]] = []

    class Props:
        total_memory = 80 << 30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: Props())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "fake 80 GiB")
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append((f, d)))
    log = logging.getLogger("test-cap")
    with caplog.at_level(logging.INFO, logger="test-cap"):
        device_memory.cap_to_budget(24 << 30, log)
        device_memory.cap_to_budget(100 << 30, log)  # above the device: the whole device, never above 1
        device_memory.cap_to_budget(None, log)
    assert calls == [(0.3, 0), (1.0, 0)]
    assert "capped at the run's budget: 24576 MiB of fake 80 GiB's 81920 MiB" in caplog.text


def test_no_cap_where_no_cuda_device_is_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: pytest.fail("capped without a device"))
    device_memory.cap_to_budget(24 << 30, logging.getLogger("test-cap"))

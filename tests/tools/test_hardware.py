"""``int8alibi hardware`` prints the machine and the plan settings that follow, for a faked card too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from int8alibi import cli
from int8alibi.hardware import ENV
from int8alibi.planning.resources import GPU_RULES

PROJECT = Path(__file__).resolve().parents[2]
A100 = {"cores": 64, "devices": [{"name": "NVIDIA A100-SXM4-80GB", "total_mb": 81920, "free_mb": 80100}]}


def test_it_prints_the_cores_the_device_and_the_lines_to_set(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ENV, json.dumps(A100))
    assert cli.main(["hardware", "--configfile", str(PROJECT / "config" / "synthetic-qwen3-1.7b.yaml")]) == 0
    out = capsys.readouterr().out
    assert "cpu cores: 64" in out and "NVIDIA A100-SXM4-80GB, 81920 MiB total, 80100 MiB free" in out
    assert "--resources gpu_mem_mb=80100" in out
    requests = [int(line.rsplit("=", 1)[1]) for line in out.splitlines() if ": gpu_mem_mb=" in line]
    assert len(requests) == len(GPU_RULES) and all(0 < r <= 80100 for r in requests)


def test_a_config_that_cannot_fit_is_refused_naming_the_stage(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ENV, json.dumps(A100))
    assert cli.main(["hardware", "--configfile", str(PROJECT / "config" / "synthetic-qwen3-14b.yaml"),
                     "--gpu-budget-mb", "24000"]) == 1
    assert "stage perplexity needs about" in capsys.readouterr().err


def test_four_devices_print_their_names_the_least_free_budget_and_four_budgets_of_limit(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    card = A100["devices"][0]
    four = {"cores": 64, "devices": [card, {**card, "free_mb": 79000}, card, card]}
    monkeypatch.setenv(ENV, json.dumps(four))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cli.main(["hardware"]) == 0
    out = capsys.readouterr().out
    assert "gpus: auto = 0, 1, 2, 3" in out and "gpu_budget_mb: auto = 79000 MiB (the least free memory of those 4" in out
    assert "--resources gpu_mem_mb=316000" in out

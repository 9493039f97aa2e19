"""`snakemake -n --profile profiles/gpu` on a faked host of four GPUs: the run resolves the four
devices, Snakemake's gpu_mem_mb limit is four times the budget, every GPU job still asks for at most
the budget (one device's worth), and each GPU job's command gives what it asked for to the runner."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .test_gpu_budget_plan import _dry_run, _gpu_requests

pytestmark = pytest.mark.slow  # runs Snakemake


def _host(free_mb: list[int]) -> str:
    return json.dumps({"cores": 16, "devices": [{"name": "NVIDIA H200", "total_mb": 143_771, "free_mb": free}
                                                for free in free_mb]})


def test_four_devices_give_four_budgets_of_limit_and_one_budget_per_job(tmp_path: Path) -> None:
    code, out = _dry_run("config/synthetic-qwen3-8b.yaml", _host([139_000, 138_500, 139_000, 139_000]), tmp_path)
    assert code == 0, out[-3000:]
    line = re.search(r"int8alibi: GPU jobs spread over devices (\S+) \((.*)\), each pinned to one; "
                     r"gpu_mem_mb limit (\d+) MiB", out)
    assert line, out[-3000:]
    assert line.group(1) == "0,1,2,3" and "the 4 NVIDIA H200 device(s)" in line.group(2)
    assert int(line.group(3)) == 4 * 138_500  # the budget: the least free memory of the four
    requests = _gpu_requests(out)
    assert {"tokens", "perplexity", "capture", "faults"} <= set(requests), requests
    assert all(0 < mb <= 138_500 for mb in requests.values()), requests
    assert re.search(r"-m int8alibi\.stages\.capture .* --gpu-mem-mb \d+ ", out), out[-3000:]


def test_one_device_prints_no_spread_and_keeps_the_budget_as_the_limit(tmp_path: Path) -> None:
    code, out = _dry_run("config/synthetic-qwen3-8b.yaml", _host([139_000]), tmp_path)
    assert code == 0, out[-3000:]
    assert "GPU jobs spread over" not in out
    assert all(0 < mb <= 139_000 for mb in _gpu_requests(out).values())

"""`snakemake -n --profile profiles/gpu` on a faked card: every GPU job asks for at most the card's
budget, or the plan stops naming the stage that cannot fit (issue 46's acceptance)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from .conftest import PROJECT, SNAKEMAKE

pytestmark = pytest.mark.slow  # runs Snakemake


def _card(free_mb: int, total_mb: int, name: str) -> str:
    return json.dumps({"cores": 16, "devices": [{"name": name, "total_mb": total_mb, "free_mb": free_mb}]})


def _dry_run(configfile: str, card: str, tmp_path: Path, *extra: str) -> tuple[int, str]:
    args = [str(SNAKEMAKE), "-n", "--profile", "profiles/gpu", "--configfile", configfile,
            "--config", "device=cuda", "arms=[cublaslt,triton]", f"results_root={tmp_path}", *extra]
    env = {"PATH": "/usr/bin:/bin", "INT8ALIBI_HARDWARE": card, "QWEN3_8B_DIR": str(tmp_path / "absent"),
           "WIKITEXT2_RAW": str(tmp_path / "absent.raw"),
           "INT8ALIBI_DISK_FREE_MB": str(1 << 20)}  # an 8B run writes ~95 GB: a smaller disk here is not the test
    result = subprocess.run(args, cwd=PROJECT, capture_output=True, text=True, timeout=300, env=env)
    return result.returncode, result.stdout + result.stderr


def _gpu_requests(out: str) -> dict[str, int]:
    got: dict[str, int] = {}
    rule = None
    for line in out.splitlines():
        if m := re.match(r"^(?:rule|checkpoint|localrule) (\w+):", line):
            rule = m.group(1)
        elif rule and "resources:" in line and (m := re.search(r"\bgpu_mem_mb=(\d+)", line)):
            got[rule] = max(int(m.group(1)), got.get(rule, 0))
    return got


def test_a_24_gb_card_refuses_the_synthetic_14b_naming_the_stage(tmp_path: Path) -> None:
    """At 14B the perplexity stage's reference engine, the bf16 parent, does not fit 24 GB by itself."""
    code, out = _dry_run("config/synthetic-qwen3-14b.yaml", _card(23_700, 24_564, "NVIDIA GeForce RTX 4090"), tmp_path)
    assert code != 0
    assert re.search(r"stage perplexity needs about \d+ MiB.*above this run's budget gpu_budget_mb=23700", out), out[-3000:]


def test_a_24_gb_card_plans_the_synthetic_8b_within_its_budget(tmp_path: Path) -> None:
    """The W8A8 engines hold the checkpoint on the device, not the bf16 parent beside it, so every
    forward pass of the 8B fits the papers' card."""
    code, out = _dry_run("config/synthetic-qwen3-8b.yaml", _card(23_700, 24_564, "NVIDIA GeForce RTX 4090"), tmp_path)
    assert code == 0, out[-3000:]
    requests = _gpu_requests(out)
    assert {"tokens", "perplexity", "capture", "generate"} <= set(requests), requests
    assert all(0 < mb <= 23_700 for mb in requests.values()), requests


def test_an_h200_plans_the_synthetic_8b_within_its_budget(tmp_path: Path) -> None:
    code, out = _dry_run("config/synthetic-qwen3-8b.yaml", _card(139_000, 143_771, "NVIDIA H200"), tmp_path)
    assert code == 0, out[-3000:]
    requests = _gpu_requests(out)
    assert {"tokens", "perplexity", "capture", "faults"} <= set(requests), requests
    assert all(0 < mb <= 139_000 for mb in requests.values()), requests


def test_the_real_8b_config_on_a_24_gb_card_asks_for_at_most_the_budget(tmp_path: Path) -> None:
    """The Qwen3-8B folder is absent here, so its size is unknown at plan time: every GPU job asks
    for the budget (and runs alone on the card) instead of more."""
    code, out = _dry_run("config/qwen3-8b.yaml", _card(23_700, 24_564, "NVIDIA GeForce RTX 4090"), tmp_path)
    assert code == 0, out[-3000:]
    requests = _gpu_requests(out)
    assert requests and set(requests.values()) == {23_700}, requests

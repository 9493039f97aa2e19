"""The paper-scale synthetic configs validate, and a SLURM dry run of the 14B one requests memory
that holds a 14B parent on every heavy rule (the parent's size comes from the preset at plan time)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from int8alibi.config import load_config
from int8alibi.model.size import model_size

from .conftest import PROJECT, SNAKEMAKE

SIZES = ["1.7b", "8b", "14b"]


@pytest.mark.parametrize("size", SIZES)
def test_synthetic_config_runs_the_preset_at_study_sizes(size: str) -> None:
    cfg = load_config(PROJECT / "config" / f"synthetic-qwen3-{size}.yaml")
    assert cfg["model"] == {"source": "synthetic", "synthetic": {"preset": f"qwen3-{size}", "seed": 0},
                            "checkpoint": None}
    assert cfg["size_profile"] == "study" and cfg["corpus"]["source"] == "package"
    assert cfg.results == Path(f"results/synthetic-qwen3-{size}")


def _requests(out: str) -> dict[str, int]:
    """Rule -> the largest mem_mb of its jobs in a dry run's job listing."""
    mem: dict[str, int] = {}
    rule = None
    for line in out.splitlines():
        if m := re.match(r"^(?:rule|checkpoint|localrule) (\w+):", line):
            rule = m.group(1)
        elif rule and (m := re.search(r"\bmem_mb=(\d+)", line)) and "resources:" in line:
            mem[rule] = max(int(m.group(1)), mem.get(rule, 0))
    return mem


@pytest.mark.slow  # runs Snakemake
def test_slurm_dry_run_of_14b_requests_what_the_parent_needs(tmp_path: Path) -> None:
    args = [str(SNAKEMAKE), "-n", "--profile", "profiles/slurm", "--configfile", "config/synthetic-qwen3-14b.yaml",
            "--config", "device=cuda", "arms=[cublaslt,triton]", f"results_root={tmp_path}"]
    # a 14B run writes about 170 GB (int8alibi.planning.disk): on a smaller disk the plan refuses it
    env = {**os.environ, "INT8ALIBI_DISK_FREE_MB": str(1 << 20)}
    result = subprocess.run(args, cwd=PROJECT, capture_output=True, text=True, timeout=300, env=env)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    parent_mib = model_size({"source": "synthetic", "synthetic": {"preset": "qwen3-14b"}}).parent_bytes / 2**20
    mem = _requests(out)
    for rule in ("model", "reference_checkpoint", "requant", "capture", "generate", "prefill_decode",
                 "perplexity", "tokens"):
        assert parent_mib < mem[rule], (rule, mem.get(rule))
        assert mem[rule] < 128_000, (rule, mem[rule])  # fits a 128 GB node
    assert mem["model"] > 2.6 * parent_mib  # the model stage's round trip, as measured

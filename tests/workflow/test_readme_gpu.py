"""README's "Run the papers' models on your GPU": every Snakemake command of its code blocks plans, as
written, with the device and arms a GPU host would resolve named (this host has no GPU, no GPU
environment and no weights; a dry run reads none of them), and ./bootstrap gpu is what it says."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from .conftest import PROJECT, SNAKEMAKE

SECTION = "## Run the papers' models on your GPU"
GPU_SNAKEMAKE = ".venv-gpu/bin/snakemake"
CUDA = ["--config", "device=cuda", "arms=[cublaslt,triton]"]


def _section() -> str:
    text = (PROJECT / "README.md").read_text()
    assert SECTION in text
    return text.split(SECTION, 1)[1].split("\n## ", 1)[0]


def _commands(section: str) -> list[list[str]]:
    """The command lines of the section's bash blocks (continuations joined, comments dropped)."""
    blocks = re.findall(r"^ *```bash\n(.*?)^ *```", section, re.M | re.S)
    lines = "\n".join(blocks).replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in lines.splitlines() if line.strip()]


def test_bootstrap_gpu_runs_snakemake_from_the_gpu_environment_with_the_gpu_profile() -> None:
    bootstrap = (PROJECT / "bootstrap").read_text()
    assert f'exec {GPU_SNAKEMAKE} --profile profiles/gpu "$@"' in bootstrap
    commands = _commands(_section())
    assert ["./bootstrap", "gpu", "-n"] in commands
    assert not any(".venv/bin/python" in word for cmd in commands for word in cmd)  # the GPU set stays out of .venv
    assert "envs/install gpu" not in (PROJECT / "README.md").read_text()


@pytest.mark.slow  # runs Snakemake
def test_the_sections_snakemake_commands_plan_with_device_cuda(tmp_path: Path) -> None:
    env = dict(os.environ)
    for name in ["QWEN3_1_7B_DIR", "QWEN3_8B_DIR", "QWEN3_14B_DIR"]:
        env[name] = str(tmp_path / name.lower())
    env["WIKITEXT2_RAW"] = str(tmp_path / "wiki.test.raw")
    planned = []
    for cmd in _commands(_section()):
        if cmd[0] != GPU_SNAKEMAKE:
            continue
        args = [str(SNAKEMAKE), *cmd[1:]] + ([] if "-n" in cmd else ["-n"]) + CUDA
        result = subprocess.run(args, cwd=PROJECT, capture_output=True, text=True, env=env, timeout=300)
        out = result.stdout + result.stderr
        assert result.returncode == 0, f"{shlex.join(cmd)}:\n{out[-3000:]}"
        config = cmd[cmd.index("--configfile") + 1]
        results = f"results/{Path(config).stem}"
        targets = [word for word in cmd[1:] if word.startswith("results/")]
        for target in targets or [f"{results}/report/report.html"]:
            assert target in out, (shlex.join(cmd), target)
        planned.append(config)
    # the check, the pin's predictions and the three sizes
    assert sorted(set(planned)) == [f"config/qwen3-{size}.yaml" for size in ("1.7b", "14b", "8b")]
    assert len(planned) == 5

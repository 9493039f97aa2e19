"""The determinism stage's engine is resolved once at plan time and shows in the printed commands:
vLLM's engine for the vLLM arm pair where vLLM can be imported, the project's own otherwise."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from .conftest import SNAKEMAKE

pytestmark = pytest.mark.slow  # every test here runs Snakemake

VLLM_PAIR = "arms=[vllm-cutlass,vllm-triton]"


def dry_run(repo: Path, *config: str, stub: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if stub is not None:  # planning finds a package named vllm: importability, faked for planning only
        env["PYTHONPATH"] = f"{stub}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run([str(SNAKEMAKE), "-n", "-p", "--cores", "2", "--config", "device=cuda", *config],
                          cwd=repo, capture_output=True, text=True, timeout=600, env=env)


def generate_commands(out: str) -> list[str]:
    return [line for line in out.splitlines() if "-m int8alibi.stages.generate " in line]


def test_the_vllm_pair_is_scheduled_on_vllms_engine_where_vllm_imports(project_copy: Path, tmp_path: Path) -> None:
    (tmp_path / "stub" / "vllm").mkdir(parents=True)
    (tmp_path / "stub" / "vllm" / "__init__.py").write_text("")
    done = dry_run(project_copy, VLLM_PAIR, stub=tmp_path / "stub")
    assert done.returncode == 0, done.stdout + done.stderr
    commands = generate_commands(done.stdout)
    assert len(commands) == 16  # 2 arms x 4 checkpoints x 2 runs
    assert all(c.endswith("--param engine=vllm 2> " + c.rsplit("2> ", 1)[1]) for c in commands), commands[:2]
    assert {re.search(r"--param arm=(\S+)", c)[1] for c in commands} == {"vllm-cutlass", "vllm-triton"}


def test_without_vllm_the_pair_and_the_own_arms_run_on_the_own_engine(project_copy: Path) -> None:
    for config in ([VLLM_PAIR], ["arms=[exact-cutlass-order,exact-triton-order]"]):
        done = dry_run(project_copy, *config)
        assert done.returncode == 0, done.stdout + done.stderr
        commands = generate_commands(done.stdout)
        assert len(commands) == 16 and all("--param engine=own" in c for c in commands), commands[:2]


def test_engine_vllm_is_refused_at_plan_time_where_vllm_does_not_import(project_copy: Path) -> None:
    done = dry_run(project_copy, VLLM_PAIR, "engine=vllm")
    assert done.returncode == 1
    assert "engine: vllm, but vLLM cannot be imported on host" in done.stderr

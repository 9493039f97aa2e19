"""The real-model configs validate and their DAGs resolve, locally and through the SLURM profile."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from int8alibi.config import load_config

from .conftest import PROJECT, SNAKEMAKE

CONFIGS = ["qwen3-1.7b", "qwen3-8b", "qwen3-14b"]


def _env(tmp_path: Path) -> dict[str, str]:
    """Point every path variable the configs name at scratch folders (a dry run reads none of them)."""
    env = dict(os.environ)
    for name in ["QWEN3_1_7B_DIR", "QWEN3_8B_DIR", "QWEN3_14B_DIR"]:
        env[name] = str(tmp_path / name.lower())
    env["WIKITEXT2_RAW"] = str(tmp_path / "wiki.test.raw")
    return env


@pytest.mark.parametrize("name", CONFIGS)
def test_config_validates_with_study_sizes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in _env(tmp_path).items():
        monkeypatch.setenv(key, value)
    cfg = load_config(PROJECT / "config" / f"{name}.yaml")
    assert cfg["model"]["source"] == "hf" and cfg["size_profile"] == "study"
    assert cfg["corpus"]["source"] == "wikitext"
    assert cfg.results == Path(f"results/{name}")


@pytest.mark.slow  # runs Snakemake
@pytest.mark.parametrize("profile", [None, "profiles/slurm"])
@pytest.mark.parametrize("name", CONFIGS)
def test_dry_run_resolves(name: str, profile: str | None, tmp_path: Path) -> None:
    args = [str(SNAKEMAKE), "-n", "--configfile", f"config/{name}.yaml"]
    args += ["--profile", profile] if profile else ["--cores", "4"]
    result = subprocess.run(args, cwd=PROJECT, capture_output=True, text=True, env=_env(tmp_path), timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert f"results/{name}/report/report.html" in out
    for stage in ["model", "requant", "capture", "prediction", "compare", "faults", "generate", "perplexity"]:
        assert f"rule {stage}:" in out or f"checkpoint {stage}:" in out, stage


@pytest.mark.slow  # runs Snakemake
def test_a_dry_run_before_the_paths_are_set_plans_and_names_the_unset_variables(tmp_path: Path) -> None:
    """With QWEN3_1_7B_DIR and WIKITEXT2_RAW unset, `${VAR}` stays in the config as written: the plan is
    still made (Snakemake must not read the `{VAR}` in a param as a wildcard) and the warning names both."""
    env = {k: v for k, v in _env(tmp_path).items() if k not in ("QWEN3_1_7B_DIR", "WIKITEXT2_RAW")}
    result = subprocess.run([str(SNAKEMAKE), "-n", "--cores", "4", "--configfile", "config/qwen3-1.7b.yaml"],
                            cwd=PROJECT, capture_output=True, text=True, env=env, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "environment variable not set" in out and "${QWEN3_1_7B_DIR}" in out and "${WIKITEXT2_RAW}" in out
    assert "results/qwen3-1.7b/report/report.html" in out and "WildcardError" not in out

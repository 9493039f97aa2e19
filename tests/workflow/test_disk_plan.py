"""`snakemake` on a faked small disk (INT8ALIBI_DISK_FREE_MB): the plan refuses the run before any job, a
dry run too, naming the figure and the folder, and nothing is written under the results folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .conftest import SNAKEMAKE, TINY_CONFIG

pytestmark = pytest.mark.slow  # runs Snakemake


def _snakemake(repo: Path, out: Path, free_mb: int, *args: str) -> tuple[int, str]:
    """Snakemake in a scratch copy (a run that is not refused would write there, as would its log), the tiny
    config's results under ``out``, the free space faked."""
    config = repo / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    command = [str(SNAKEMAKE), "--cores", "1", "--configfile", str(config), "--config", f"results_root={out}", *args]
    env = {"PATH": "/usr/bin:/bin", "INT8ALIBI_DISK_FREE_MB": str(free_mb)}
    result = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300, env=env)
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize("dry", [True, False], ids=["dry run", "run"])
def test_a_run_that_does_not_fit_is_refused_before_any_job(project_copy: Path, tmp_path: Path, dry: bool) -> None:
    code, out = _snakemake(project_copy, tmp_path / "out", 1, *(["-n"] if dry else []))
    assert code != 0
    refusals = [line for line in out.splitlines() if line.startswith("int8alibi: disk: this run still writes about")]
    assert len(refusals) == 1, out[-3000:]
    assert f"under {tmp_path / 'out' / 'results'} (" in refusals[0] and "1.0 MB (1048576 bytes) free" in refusals[0]
    assert "Job stats" not in out and "rule " not in out  # no job planned, none started
    assert not (tmp_path / "out").exists()  # nothing under the results folder, nor the folder itself


def test_a_run_that_fits_is_planned_and_deleting_outputs_is_never_refused(project_copy: Path, tmp_path: Path) -> None:
    code, out = _snakemake(project_copy, tmp_path / "out", 10_000, "-n")
    assert code == 0 and "disk:" not in out, out[-3000:]
    code, out = _snakemake(project_copy, tmp_path / "out", 1, "--delete-all-output", "--dry-run")
    assert code == 0 and "disk:" not in out, out[-3000:]

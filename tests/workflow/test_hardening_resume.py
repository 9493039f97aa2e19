"""Kill and resume through Snakemake itself, on the tiny model in scratch copies of a finished run
(``files.transaction``): a real stage killed mid-run (its process alone, or with Snakemake's whole
process group) leaves its previous outputs in place, which verify, and after `snakemake --unlock` the
next run redoes the job; a job that fails after restoring outputs a crashed run had set aside, with
Snakemake holding no copy of them (a fresh copy of the checkout), loses none of them."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from int8alibi.files.atomic import host_tag

from .conftest import BIN, SNAKEMAKE, TINY_CONFIG, commit_all, copy_project, copy_run, sh, snakemake, venv_env

pytestmark = pytest.mark.slow  # every test here runs Snakemake

TARGET = "results/faults_smoke/manifest.json"  # model -> reference -> requant -> capture -> faults_smoke
ARGS = ("--profile", "profiles/default", "--cores", "2")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = copy_project(tmp_path_factory.mktemp("resume") / "project")
    (repo / "config" / "test.yaml").write_text(TINY_CONFIG)
    commit_all(repo, "test config")
    snakemake(repo, TARGET)
    return repo


def digests(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) with its bytes' digest."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def snapshots(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.previous"))


def verified(repo: Path, folder: str = "results") -> str:
    done = sh(repo, str(BIN / "int8alibi"), "verify", folder, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and " 0 error(s)" in out, out[-3000:]
    return out


@pytest.mark.parametrize("who", ["the stage", "snakemake and the stage"])
def test_a_stage_killed_mid_run_leaves_its_previous_outputs_and_the_next_run_redoes_it(finished: Path,
                                                                                       tmp_path: Path,
                                                                                       who: str) -> None:
    repo = copy_run(finished, tmp_path / "run")
    folder = repo / "results" / "capture"
    before = digests(folder)
    run = subprocess.Popen([str(SNAKEMAKE), TARGET, "--forcerun", "capture", *ARGS, "--configfile",
                            "config/test.yaml"], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=venv_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not snapshots(folder):  # capture has set its previous outputs aside and computes
            assert run.poll() is None and time.monotonic() < deadline, "capture ended before it could be killed"
            time.sleep(0.05)
        found = re.search(r"-(\d+)\.[0-9a-f]+\.previous$", snapshots(folder)[0].name)
        assert found is not None
        if who == "the stage":
            os.kill(int(found[1]), signal.SIGKILL)
        else:
            os.killpg(run.pid, signal.SIGKILL)
        out, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode != 0, out[-3000:]
    deadline = time.monotonic() + 60
    while snapshots(folder) and time.monotonic() < deadline:  # the stage's watcher puts them back
        time.sleep(0.05)
    assert digests(folder) == before and not snapshots(folder)
    sh(repo, str(SNAKEMAKE), "--unlock", *ARGS, "--configfile", "config/test.yaml")
    verified(repo)
    if who == "snakemake and the stage":  # Snakemake marked the job incomplete, and its outputs are there
        dry = snakemake(repo, TARGET, "-n")
        assert "checkpoint capture:" in dry.stdout + dry.stderr, dry.stdout[-3000:]
    snakemake(repo, TARGET)
    assert {k: v for k, v in digests(folder).items() if k != "manifest.json"} == \
        {k: v for k, v in before.items() if k != "manifest.json"}
    verified(repo)


def test_a_job_failing_after_a_crash_keeps_the_outputs_snakemake_holds_no_copy_of(finished: Path,
                                                                                    tmp_path: Path) -> None:
    """The host crashed mid-stage (the watcher too): the model stage's previous outputs sit in its
    snapshot, and Snakemake, seeing no outputs when it prepares the job, keeps no copy of them. The job
    fails after the stage restored them; Snakemake's cleanup of a failed job's outputs must find nothing
    to delete, and the next run puts them back before redoing the job."""
    repo = copy_run(finished, tmp_path / "run")
    folder = repo / "results" / "model"
    before = digests(folder)
    crashed = folder / f".model.{host_tag()}-999999999.0badc0de.previous"
    crashed.mkdir()
    for entry in sorted(folder.iterdir()):
        if entry != crashed:
            entry.rename(crashed / entry.name)
    shutil.rmtree(repo / ".snakemake" / "backups", ignore_errors=True)
    bad = tmp_path / "bad-parent"
    bad.mkdir()
    (bad / "config.json").write_text("{")
    bad_config = tmp_path / "bad.yaml"  # outside the checkout: git's record of it stays clean
    bad_config.write_text(
        TINY_CONFIG.replace("  source: synthetic\n  synthetic: {preset: tiny, seed: 0}", f"  source: hf\n  parent: {bad}"))
    done = sh(repo, str(SNAKEMAKE), "results/model/manifest.json", *ARGS, "--configfile", str(bad_config),
              check=False)
    assert done.returncode != 0 and "not readable JSON" in (repo / "logs" / "model.log").read_text()
    assert [p.name for p in folder.iterdir()] == [crashed.name], done.stdout[-3000:]
    assert digests(crashed) == before
    snakemake(repo, "results/model/manifest.json")
    assert {k: v for k, v in digests(folder).items() if k != "manifest.json"} == \
        {k: v for k, v in before.items() if k != "manifest.json"}
    assert not snapshots(folder)
    verified(repo, "results/model")  # its readers rerun next (its manifest is new), as for any rerun of it

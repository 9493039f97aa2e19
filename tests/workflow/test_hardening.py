"""Hostile and careless inputs through Snakemake itself, in scratch copies of the project: a
`results` value that would inject a command, leave the tree or follow a symlink out is refused before
anything runs; alias bombs, huge counts and huge strings end in one named error; a checkout whose
path holds a space runs real jobs; and a dry run issued while a run executes changes nothing that
run's jobs read (the run config is immutable per configuration)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import SNAKEMAKE, TINY_CONFIG, copy_project

pytestmark = pytest.mark.slow  # every test here runs Snakemake

BIN = Path(sys.executable).parent
TARGET = "results/faults_smoke/manifest.json"  # model -> requant -> capture -> faults_smoke: real jobs


def smk(repo: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.run([str(SNAKEMAKE), *args], cwd=repo, capture_output=True, text=True, timeout=timeout, env=env)


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if ".snakemake" not in p.parts}


def refused(done: subprocess.CompletedProcess, *words: str) -> str:
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("int8alibi: ")]
    assert lines and all(w in lines[0] for w in words), out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = copy_project(tmp_path_factory.mktemp("hostile") / "project")
    (repo / "config" / "test.yaml").write_text(TINY_CONFIG)
    return repo


@pytest.mark.parametrize("how", ["--config", "--configfile"])
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "real-run"])
def test_a_results_value_that_injects_a_command_is_refused_and_nothing_runs(hostile: Path, how: str,
                                                                           dry: bool) -> None:
    value = "x;touch pwned;echo "
    before = files(hostile)
    if how == "--config":
        args = ["--configfile", "config/test.yaml", "--config", f"results={value}"]
    else:
        (hostile / "config" / "evil.yaml").write_text(TINY_CONFIG.replace("results: results", f'results: "{value}"'))
        args = ["--configfile", "config/evil.yaml"]
    done = smk(hostile, *(["-n"] if dry else []), "--cores", "1", *args)
    refused(done, "results", "does not match")
    (hostile / "config" / "evil.yaml").unlink(missing_ok=True)
    assert not list(hostile.rglob("pwned")) and not (Path.cwd() / "pwned").exists()
    assert files(hostile) == before  # nothing created, not even a results folder


def test_results_outside_the_tree_or_through_a_symlink_out_are_refused(hostile: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (hostile / "results_link").symlink_to(outside)
    try:
        for value, words in (("../../elsewhere", ("results", "does not match")),
                             ("results_link", ("results_link", "outside the checkout", "results_root")),
                             ("results_link/run", ("outside the checkout",)),
                             (str(tmp_path / "abs"), ("is not a relative path", "results_root"))):
            for dry in (["-n"], []):
                done = smk(hostile, *dry, "--cores", "1", "--configfile", "config/test.yaml", "--config",
                           f"results={value}")
                refused(done, *words)
        assert not list(outside.iterdir()) and not (tmp_path / "abs").exists()
        assert not (hostile.parent.parent / "elsewhere").exists()
    finally:
        (hostile / "results_link").unlink()


def test_results_root_puts_results_outside_the_checkout_on_request(hostile: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    done = smk(hostile, "-n", "-p", "--cores", "1", "--configfile", "config/test.yaml", "--config",
               f"results_root={scratch}")
    assert done.returncode == 0, done.stderr[-3000:]
    commands = [line for line in done.stdout.splitlines() if line.startswith("Shell command:") and "None" not in line]
    # every job writes under the named root: a stage's --out, or (report_figures) its output folder
    assert commands and all(f"{scratch}/results/" in c for c in commands), commands[:3]
    assert sum(f"--out {scratch}/results/" in c for c in commands) >= len(commands) - 1, commands
    assert not scratch.exists()  # a dry run writes nothing there
    refused(smk(hostile, "-n", "--cores", "1", "--configfile", "config/test.yaml", "--config",
                "results_root=relative/dir"), "results_root")


def test_more_bad_inputs_end_in_one_named_error_quickly(hostile: Path) -> None:
    cases = {
        "newline.yaml": (TINY_CONFIG.replace("results: results", 'results: "results\\nrm -rf x"'), ("results",)),
        "huge.yaml": (TINY_CONFIG.replace("size_profile: tiny", "size_profile: " + "x" * 10_000_000),
                      ("huge.yaml", "more than the 1048576")),
        "long.yaml": (TINY_CONFIG.replace("size_profile: tiny", "size_profile: " + "x" * 500_000),
                      ("size_profile", "maxLength")),
        "deep.yaml": (TINY_CONFIG.replace("seed: 0}", "seed: {deep: [1]}}"), ("model/synthetic/seed", "integer")),
        "duplicate.yaml": (TINY_CONFIG + "device: cuda\n", ("duplicate.yaml", "line 10: duplicate key 'device'")),
        "shards.yaml": (TINY_CONFIG + "faults_shards: 100000\n", ("faults_shards", "maximum of 1024")),
        "profile.yaml": (TINY_CONFIG.replace("size_profile: tiny", "size_profile: nope"),
                         ("analysis.yaml", "no size profile 'nope'")),
        "twice.yaml": (TINY_CONFIG.replace("arms: auto", "arms: [exact-cutlass-order, exact-cutlass-order]"),
                       ("arms", "names the same arm twice")),
        "unknown.yaml": (TINY_CONFIG.replace("arms: auto", "arms: [nonexistent, triton]"),
                         ("arms", "unknown kernel arm 'nonexistent'")),
    }
    for name, (text, words) in cases.items():
        (hostile / "config" / name).write_text(text)
        start = time.monotonic()
        line = refused(smk(hostile, "-n", "--cores", "1", "--configfile", f"config/{name}", timeout=120), *words)
        assert len(line) < 1000 and time.monotonic() - start < 120, line[:500]
        (hostile / "config" / name).unlink()
    refused(smk(hostile, "-n", "--cores", "1", "--configfile", "config/test.yaml", "--config",
                "size_profile=" + "y" * 100_000, timeout=120), "size_profile", "maxLength")
    start = time.monotonic()
    refused(smk(hostile, "-n", "--cores", "1", "--configfile", "config/test.yaml", "--config", "faults_shards=1e20",
                timeout=120), "faults_shards", "maximum of 1024")
    assert time.monotonic() - start < 120


def alias_bomb() -> str:
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for prev, name in zip("abcdefgh", "bcdefghi"):
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
    return text


def test_an_alias_bomb_in_the_config_or_an_untracked_amendment_is_a_named_error(hostile: Path) -> None:
    bomb = alias_bomb()
    (hostile / "config" / "bomb.yaml").write_text(TINY_CONFIG + "extra:\n" + "".join(f"  {line}\n" for line in bomb.splitlines()))
    refused(smk(hostile, "-n", "--cores", "1", "--configfile", "config/bomb.yaml", timeout=120),
            "bomb.yaml", "anchor &a refused")
    (hostile / "config" / "bomb.yaml").unlink()
    amendment = hostile / "amendments" / "A-9999.yaml"
    amendment.write_text(bomb)
    try:
        refused(smk(hostile, "-n", "--cores", "1", "--configfile", "config/test.yaml", timeout=120),
                "amendments/A-9999.yaml", "line 1: anchor &a refused")
    finally:
        amendment.unlink()


def test_a_config_name_with_a_newline_and_escape_codes_prints_as_one_escaped_line(hostile: Path) -> None:
    name = "bad\nint8alibi: all verified\x1b[32m.yaml"
    (hostile / "config" / name).write_text(TINY_CONFIG + "extra: &a 1\n")
    try:
        done = smk(hostile, "-n", "--cores", "1", "--configfile", f"config/{name}", timeout=120)
    finally:
        (hostile / "config" / name).unlink()
    line = refused(done, "anchor &a refused")
    assert "bad\\x0aint8alibi: all verified\\x1b[32m.yaml" in line
    assert "int8alibi: all verified" not in (done.stdout + done.stderr).replace(line, "")


def test_readme_boolean_spelling_is_accepted_and_a_dry_run_writes_no_run_config(hostile: Path) -> None:
    for value in ("true", "false", "True"):
        done = smk(hostile, "-n", "--cores", "1", "--configfile", "config/test.yaml", "--config",
                   f"exploratory={value}")
        assert done.returncode == 0, done.stderr[-3000:]
    for flag in ("--dag", "--summary"):
        assert smk(hostile, flag, "--configfile", "config/test.yaml").returncode == 0
    assert not list(hostile.glob("results/.run/*/config.yaml")) and not (hostile / "results/.run/current").exists()


def parquet_digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.parquet"))}


@pytest.fixture(scope="module")
def run_with_a_space(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's first real jobs (model, requant, capture, faults_smoke) from a checkout whose
    path holds a space."""
    repo = copy_project(tmp_path_factory.mktemp("space") / "with space" / "project")
    (repo / "config" / "test.yaml").write_text(TINY_CONFIG)
    done = smk(repo, TARGET, "--cores", "2", "--configfile", "config/test.yaml", timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return repo


@pytest.mark.slow
def test_a_checkout_path_with_a_space_runs_real_jobs(run_with_a_space: Path) -> None:
    repo = run_with_a_space
    assert " " in str(repo)
    manifest = json.loads((repo / TARGET).read_text())
    assert manifest["exploratory"] is False and parquet_digests(repo / "results" / "faults_smoke")
    run_configs = list(repo.glob("results/.run/*/config.yaml"))
    assert len(run_configs) == 1
    assert (repo / "results/.run/current").read_text().strip() == f"{run_configs[0].parent.name}/config.yaml"
    # written once: a later invocation of the same configuration (a run with nothing to do) leaves it as it is
    before = run_configs[0].stat().st_mtime_ns, run_configs[0].read_bytes()
    done = smk(repo, TARGET, "--cores", "1", "--configfile", "config/test.yaml")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_configs[0].stat().st_mtime_ns, run_configs[0].read_bytes()) == before


@pytest.mark.slow
def test_a_dry_run_during_a_run_does_not_change_what_its_jobs_read(run_with_a_space: Path,
                                                                   tmp_path: Path) -> None:
    """The F6 race: `snakemake -n --config exploratory=true` while the run executes; the run's later
    jobs still read their own run config, so their tables equal a clean run's byte for byte."""
    repo = copy_project(tmp_path / "race")
    (repo / "config" / "test.yaml").write_text(TINY_CONFIG)
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    run = subprocess.Popen([str(SNAKEMAKE), TARGET, "--cores", "2", "--configfile", "config/test.yaml"], cwd=repo,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 600
        while not (repo / "logs" / "model.log").exists():  # the first job has started
            assert run.poll() is None and time.monotonic() < deadline, "the run ended before its first job"
            time.sleep(0.2)
        dry = smk(repo, "-n", "--cores", "1", "--configfile", "config/test.yaml", "--config", "exploratory=true")
        assert dry.returncode == 0, dry.stderr[-3000:]
        # the job that reads exploratory (faults_smoke) has not started yet: the race was exercised
        assert not (repo / "logs" / "faults_smoke.log").exists(), "inconclusive: faults_smoke ran before the dry run"
        out, _ = run.communicate(timeout=1200)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out[-3000:]
    assert json.loads((repo / TARGET).read_text())["exploratory"] is False
    clean = run_with_a_space / "results" / "faults_smoke"
    assert parquet_digests(repo / "results" / "faults_smoke") == parquet_digests(clean)
    assert len(list(repo.glob("results/.run/*/config.yaml"))) == 1  # the dry run wrote none


@pytest.mark.slow
def test_a_second_run_into_the_same_results_folder_is_refused_while_one_executes(tmp_path: Path) -> None:
    """Another config (here past Snakemake's own lock with --nolock, as from a second checkout sharing
    results_root) is refused by the results folder's run lock with one line; the first run finishes."""
    repo = copy_project(tmp_path / "concurrent")
    (repo / "config" / "test.yaml").write_text(TINY_CONFIG)
    (repo / "config" / "other.yaml").write_text(TINY_CONFIG.replace("exploratory: false", "exploratory: true"))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    run = subprocess.Popen([str(SNAKEMAKE), "results/capture/manifest.json", "--cores", "1", "--configfile",
                            "config/test.yaml"], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=env)
    try:
        deadline = time.monotonic() + 600
        while not (repo / "logs" / "model.log").exists():
            assert run.poll() is None and time.monotonic() < deadline, "the run ended before its first job"
            time.sleep(0.2)
        second = smk(repo, "results/capture/manifest.json", "--cores", "1", "--nolock", "--configfile",
                     "config/other.yaml")
        assert run.poll() is None, "inconclusive: the first run ended before the second started"
        line = refused(second, "results: another run is executing into this results folder", "process")
        assert str(run.pid) in line
        out, _ = run.communicate(timeout=1200)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out[-3000:]
    assert len(list(repo.glob("results/.run/*/config.yaml"))) == 1  # the refused run wrote no run config


@pytest.mark.slow
def test_an_upstream_manifest_rewritten_with_the_same_tables_reruns_its_readers(run_with_a_space: Path) -> None:
    """What changing only the second arm does to capture (its index bytes stay, its manifest does not):
    faults_smoke, whose manifest links capture's, is scheduled again instead of failing later with
    'chain broken' (Snakemake skips an input whose bytes are unchanged, so the manifest is an input)."""
    repo = run_with_a_space
    args = (TARGET, "-n", "--cores", "1", "--configfile", "config/test.yaml")
    done = smk(repo, *args)
    assert done.returncode == 0 and "Nothing to be done" in done.stdout + done.stderr, done.stdout[-2000:]
    manifest = repo / "results" / "capture" / "manifest.json"
    original = manifest.read_bytes()
    try:
        manifest.write_bytes(original + b"\n")  # what a rerun writes: a new manifest, the same tables
        done = smk(repo, *args)
        out = done.stdout + done.stderr
        assert done.returncode == 0 and "rule faults_smoke:" in out, out[-3000:]
        assert "results/capture/manifest.json" in out  # named as the updated input
    finally:
        manifest.write_bytes(original)


def tree_digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_job_that_fails_under_snakemake_leaves_the_previous_outputs_as_they_were(run_with_a_space: Path,
                                                                                   tmp_path: Path) -> None:
    """Declared outputs are `update()` (Snakemake keeps a copy and puts it back when the job fails) and
    the stage itself runs as a transaction on its folder, so the parent folder beside them stays too.
    Last in this file: Snakemake records the failed attempt's params, so the next run redoes the stage."""
    repo = run_with_a_space
    bad = tmp_path / "bad-parent"
    bad.mkdir()
    (bad / "config.json").write_text("{")
    (repo / "config" / "bad.yaml").write_text(
        TINY_CONFIG.replace("  source: synthetic\n  synthetic: {preset: tiny, seed: 0}",
                            f"  source: hf\n  parent: {bad}"))
    before = tree_digests(repo / "results" / "model")
    done = smk(repo, "results/model/manifest.json", "--cores", "1", "--configfile", "config/bad.yaml")
    assert done.returncode != 0 and "Restored previous version" in done.stdout + done.stderr
    assert "not readable JSON" in (repo / "logs" / "model.log").read_text()
    assert tree_digests(repo / "results" / "model") == before
    assert not list((repo / "results").rglob("*.previous"))


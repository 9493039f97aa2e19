"""Two tiny configs run to the end, gathered by the crossmodel target; the report read in Chromium.

Each config writes its own results folder (``results: results/<name>``); ``snakemake crossmodel
--config 'crossmodel=[...]'`` sets them side by side. The report of one run is then opened in
headless Chromium at 1280 px: the page must not scroll sideways, every figure must paint, and the
first screen must hold the run's setup beside the papers' and the start of the findings.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest

from int8alibi.protocol import load

from ..report.render import render
from .conftest import BIN, SNAKEMAKE, commit_all, copy_project, venv_env

pytestmark = pytest.mark.slow

TINY = """\
model:
  source: synthetic
  synthetic: {{preset: tiny, seed: {seed}}}
size_profile: tiny
corpus: {{source: synthetic}}
device: cpu
arms: auto
exploratory: true
results: results/{name}
"""
RUNS = {"tiny-a": 0, "tiny-b": 1}
FIRST_SCREEN_PX = 900


def _command(*args: str) -> list[str]:
    return [str(SNAKEMAKE), *args, "--profile", "profiles/default", "--cores", "2"]


def _check(args: list[str], returncode: int, stdout: str, stderr: str) -> None:
    if returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed:\n{stdout[-3000:]}\n{stderr[-3000:]}")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both configs run at once, two Snakemake processes in one checkout (their results folders, and
    so their outputs and locks, are disjoint), then the crossmodel view over them."""
    repo = copy_project(tmp_path_factory.mktemp("crossmodel") / "project")
    for name, seed in RUNS.items():
        (repo / "config" / f"{name}.yaml").write_text(TINY.format(name=name, seed=seed))
    commit_all(repo, "two tiny configs")
    started = {name: subprocess.Popen(_command("--configfile", f"config/{name}.yaml"), cwd=repo, env=venv_env(),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name in RUNS}
    try:
        for proc in started.values():
            stdout, stderr = proc.communicate(timeout=1800)
            _check(proc.args, proc.returncode, stdout, stderr)
    finally:
        for proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    args = _command("crossmodel", "--config", "crossmodel=[" + ",".join(f"results/{n}" for n in RUNS) + "]")
    done = subprocess.run(args, cwd=repo, capture_output=True, text=True, timeout=600, env=venv_env())
    _check(args, done.returncode, done.stdout, done.stderr)
    return repo


def test_crossmodel_sets_every_claim_of_both_runs_side_by_side(two_runs: Path) -> None:
    folder = two_runs / "results" / "crossmodel"
    table = pd.read_parquet(folder / "models.parquet")
    claims = [c["id"] for c in load(two_runs / "preregistration").paper["claims"]]
    assert sorted(zip(table["claim"], table["run"])) == sorted((c, r) for c in claims for r in RUNS)
    for name in RUNS:  # each value is the run's own: the campaign size from its own totals table
        totals = pd.read_parquet(two_runs / "results" / name / "faults" / "totals.parquet")
        cells = totals[(totals["definition"] == "stated") & (totals["quantity"] == "cells")]["value"].item()
        row = table[(table["claim"] == "cells") & (table["run"] == name)].iloc[0]
        assert (row["value"], row["number"]) == (f"{cells:,}", float(cells))
        assert row["model"] == "synthetic tiny"
    md = (folder / "models.md").read_text()
    assert "| claim | paper | definition | tiny-a (synthetic tiny) | tiny-b (synthetic tiny) |" in md
    verify = subprocess.run([str(BIN / "int8alibi"), "verify", "results"], cwd=two_runs, capture_output=True, text=True)
    assert verify.returncode == 0 and "0 error" in verify.stdout, verify.stdout + verify.stderr


def test_report_fits_1280_px_and_paints_every_figure(two_runs: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    html = two_runs / "results" / "tiny-a" / "report" / "report.html"
    seen = render(html, tmp_path / "chromium", width=1280, height=FIRST_SCREEN_PX)
    with capsys.disabled():  # in the test output even when it passes
        print(f"\nfirst screen of the report at 1280 px: {seen.screenshot}")
    assert seen.scroll_width <= seen.client_width, f"the page scrolls sideways: {seen.scroll_width} > {seen.client_width}"
    figures = {f["id"] for f in seen.figures}
    assert {"ulp", "detection", "perplexity"} <= figures, figures
    for figure in seen.figures:
        assert figure["width"] > 100 and figure["height"] > 40 and figure["marks"] > 2, figure
        assert figure["right"] <= seen.client_width, figure
    tops = {h["text"]: h["top"] for h in seen.headings}
    assert list(tops)[:4] == ["Glossary", "Run setup", "Findings", "The papers' results beside this run"]
    # the first screen answers the question: the verdict box opens the page and its answer line is in view
    box = seen.boxes[0]
    assert box["text"].startswith("The answer, and the papers' headline claims on this run"), box
    assert box["top"] < 200 and "Answer:" in box["text"], box
    assert box["top"] < tops["Glossary"] and box["bottom"] < 2 * FIRST_SCREEN_PX, box
    # the parent is synthetic: what rests on language has no verdict, in the box and in the findings
    md = html.with_suffix(".md").read_text()
    assert "no verdict Perplexity change of pow2-nearest against own" in box["text"]  # the bold word, then the claim
    assert "(synthetic weights)" in box["text"]
    assert "| H1 | hypothesis | no verdict: synthetic weights" in md
    assert seen.screenshot.stat().st_size > 10_000

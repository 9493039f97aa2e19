"""Each config key a stage's rule digests (int8alibi.planning.stage_needs) reruns exactly the stages
whose bytes it can change, on the session's finished tiny run.

For every declared key, a config with only that key flipped is planned with `snakemake --summary`,
whose per-file status says "params changed" for the jobs that rerun because of their own params,
whatever runs upstream of them (a dry run's reason names only the first cause); that set must be the
stages below whose tables the key moves. Real reruns of every flip would run the DAG again six times;
`exploratory` alone is also run for real, to see which stages' bytes it moves.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from int8alibi.planning.stage_needs import STAGES

from .conftest import SNAKEMAKE, TINY_CONFIG, copy_run, snakemake

pytestmark = pytest.mark.slow

ARMS = "[exact-cutlass-order, exact-triton-order]"  # the pair `auto` resolves to on a CPU
# The stages whose output bytes (tables, tensors, tokens, the report's text) each key can change.
BYTES = {
    "model": {"model", "requant", "capture", "generate", "prefill_decode", "perplexity", "tokens", "batch", "report"},
    "size_profile": {"capture", "generate", "prefill_decode", "perplexity", "tokens", "batch", "report"},
    "corpus": {"capture", "perplexity", "tokens", "report"},
    "device": {"requant", "capture", "prediction", "compare", "faults", "generate", "determinism", "prefill_decode",
               "perplexity", "tokens", "batch", "report"},
    "arms": {"capture", "compare", "determinism", "prefill_decode", "perplexity", "tokens", "batch", "report"},
    # the two tables that carry the flag in a column; the report reads it from their manifests
    "exploratory": {"compare", "faults"},
}
# Each key flipped alone in the tiny run's config (device with the pair `auto` gave, so the arms do not move).
FLIPS = {
    "model": ("synthetic: {preset: tiny, seed: 0}", "synthetic: {preset: tiny, seed: 1}"),
    "size_profile": ("size_profile: tiny", "size_profile: default-cpu"),
    "corpus": ("corpus: {source: synthetic}", "corpus: {source: package}"),
    "device": ("device: cpu\narms: auto", f"device: cuda\narms: {ARMS}"),
    "arms": ("arms: auto", "arms: [exact-triton-order, exact-cutlass-order]"),
    "exploratory": ("exploratory: false", "exploratory: true"),
}
@pytest.fixture(scope="module")
def finished_run(pinned_tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_run(pinned_tiny_run, tmp_path_factory.mktemp("flips") / "project")


def flipped(repo: Path, key: str) -> str:
    """A config file with ``key`` flipped, relative to ``repo``."""
    before, after = FLIPS[key]
    assert TINY_CONFIG.count(before) == 1, before
    (repo / "config" / "flip.yaml").write_text(TINY_CONFIG.replace(before, after))
    return "config/flip.yaml"


def summary(repo: Path, configfile: str) -> dict[str, set[str]]:
    """``{status: rules}`` of `snakemake --summary`, one status per output file."""
    done = subprocess.run([str(SNAKEMAKE), "--summary", "--configfile", configfile], cwd=repo, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    header, *rows = [line.split("\t") for line in done.stdout.splitlines() if "\t" in line]
    status, rule = header.index("status"), header.index("rule")
    out: dict[str, set[str]] = {}
    for row in rows:
        out.setdefault(row[status], set()).add(row[rule])
    return out


def table_digests(results: Path) -> dict[str, str]:
    """Every output but the manifests, by its path: a stage's bytes."""
    return {p.relative_to(results).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(results.rglob("*")) if p.is_file() and p.name != "manifest.json"
            and p.relative_to(results).parts[0] not in (".run", "report", "figures")}


def test_every_declared_key_is_flipped() -> None:
    assert set(FLIPS) == set(BYTES) == {key for needs in STAGES.values() for key in needs.config}


@pytest.mark.parametrize("key", list(FLIPS))
def test_a_flipped_key_reruns_exactly_the_stages_whose_bytes_it_changes(finished_run: Path, key: str) -> None:
    statuses = summary(finished_run, "config/test.yaml")
    assert set(statuses) == {"ok"}, statuses  # the finished run is current
    statuses = summary(finished_run, flipped(finished_run, key))
    changed = statuses.pop("params changed")
    if key == "device":  # a CUDA run adds the K sweep to the report's inputs, a change Snakemake names first,
        # and its table's page (tables/ksweep_summary.html) to the report's outputs
        assert statuses.pop("missing") == {"ksweep", "report"}
        changed |= statuses.pop("set of input files changed")
    assert changed == BYTES[key]
    assert set(statuses) <= {"ok"}, statuses


def test_exploratory_moves_the_bytes_of_compare_and_faults_and_the_report_says_so(finished_run: Path) -> None:
    """Run for real: the stages whose tables the flag moves are BYTES["exploratory"], and the report,
    which reads the flag from their manifests, calls the run exploratory."""
    results = finished_run / "results"
    before = table_digests(results)
    snakemake(finished_run, "--config", "exploratory=true")
    after = table_digests(results)
    assert set(after) == set(before)
    assert {path.split("/")[0] for path in before if before[path] != after[path]} == BYTES["exploratory"]
    for stage in BYTES["exploratory"]:
        assert json.loads((results / stage / "manifest.json").read_text())["exploratory"] is True, stage
    assert "EXPLORATORY run" in (results / "report" / "report.md").read_text()

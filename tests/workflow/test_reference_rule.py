"""The reference_checkpoint rule is in the DAG exactly when the config names no committed checkpoint,
and runs llm-compressor's interpreter, named relatively."""

from __future__ import annotations

from pathlib import Path

import yaml

import pytest

from .conftest import dry_run, scheduled_jobs

pytestmark = pytest.mark.slow  # every test here runs Snakemake

TINY = {"size_profile": "tiny", "corpus": {"source": "synthetic", "path": None}}


def _jobs(repo: Path, checkpoint: str | None) -> tuple[set[str], str]:
    config = dict(TINY, model={"source": "synthetic", "synthetic": {"preset": "tiny", "seed": 0},
                              "checkpoint": checkpoint})
    (repo / "config" / "reference-test.yaml").write_text(yaml.safe_dump(config))
    done = dry_run(repo, "-p", "results/requant/manifest.json", "--configfile", "config/reference-test.yaml")
    assert done.returncode == 0, done.stderr[-3000:]
    return scheduled_jobs(done.stdout), done.stdout


def test_without_a_committed_checkpoint_llm_compressor_makes_the_reference(project_copy: Path) -> None:
    jobs, out = _jobs(project_copy, None)
    assert jobs == {"model", "reference_checkpoint", "requant"}
    assert ".venv-llmcompressor/bin/python -m int8alibi.stages.reference --config" in out
    assert "--input reference=results/reference/manifest.json" in out


def test_a_committed_checkpoint_is_the_reference_and_the_rule_is_not_in_the_dag(project_copy: Path) -> None:
    jobs, out = _jobs(project_copy, "tests/fixtures/llmcompressor/quantized")
    assert jobs == {"model", "requant"}
    assert "stages.reference" not in out and "--input reference=" not in out

"""`amend` appends a record the gate accepts; it refuses to amend a broken or invalid protocol."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from int8alibi.errors import ProtocolError
from int8alibi.protocol import gate, load, pinned_data_digest, verify_data_pin
from int8alibi.tools.amend import amend, main
from int8alibi.protocol.chain import read_amendments
from int8alibi.protocol.pins import STAGE_FILES
from int8alibi.protocol.schema import read_yaml

from .conftest import commit_all

ALL_READERS_OF_ANALYSIS = [stage for stage, files in STAGE_FILES.items() if "analysis.yaml" in files]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _raise_resamples(repo: Path) -> Path:
    path = repo / "preregistration" / "analysis.yaml"
    text = path.read_text()
    assert "resamples: 2000" in text
    path.write_text(text.replace("resamples: 2000", "resamples: 4000", 1))
    return path


def test_amend_writes_the_next_record_and_the_gate_accepts_it(repo: Path) -> None:
    before = read_amendments(repo)
    changed = _raise_resamples(repo)
    with pytest.raises(ProtocolError, match="analysis.yaml: sha256"):
        gate(repo)
    path = amend(repo, "More bootstrap resamples", "Narrower Monte Carlo error.", ALL_READERS_OF_ANALYSIS, "pre-data")
    number = before[-1].number + 1
    assert path == repo / "amendments" / f"A-{number:04d}.yaml"
    record = read_yaml(path)
    assert record["id"] == f"A-{number:04d}"
    assert record["previous_sha256"] == _sha(repo / before[-1].rel)
    assert record["pins"]["preregistration/analysis.yaml"] == _sha(changed)
    assert record["stages"] == ALL_READERS_OF_ANALYSIS
    report = gate(repo)
    assert report.amendment == record["id"] and report.history.status == "verified"
    assert load(repo / "preregistration").analysis["bootstrap"]["resamples"] == 4000
    commit_all(repo, "amend: more resamples")  # adding a record after the lock is allowed
    assert gate(repo).history.status == "verified"


def test_amend_requires_every_stage_that_reads_a_changed_file(repo: Path) -> None:
    _raise_resamples(repo)
    before = sorted(p.name for p in (repo / "amendments").iterdir())
    with pytest.raises(
        ProtocolError,
        match=r"preregistration/analysis\.yaml: changed since amendments/A-\d{4}\.yaml, and stage 'batch' reads it",
    ):
        amend(repo, "s", "r", ["protocol", "perplexity"], "pre-data")
    assert sorted(p.name for p in (repo / "amendments").iterdir()) == before


def test_amend_refuses_a_broken_chain(repo: Path) -> None:
    path = repo / "amendments" / "A-0002.yaml"
    path.write_bytes(path.read_bytes() + b"# edited\n")
    count = len(list((repo / "amendments").iterdir()))
    with pytest.raises(ProtocolError, match=r"^amendments/A-0002\.yaml: uncommitted change"):
        amend(repo, "s", "r", ["protocol"], "pre-data")
    assert len(list((repo / "amendments").iterdir())) == count


def test_amend_refuses_an_invalid_protocol(repo: Path) -> None:
    path = repo / "preregistration" / "thresholds.yaml"
    path.write_text(path.read_text().replace("ulp_tolerance: 1", "ulp_tolerance: one", 1))
    with pytest.raises(
        ProtocolError, match=r"thresholds\.yaml: does not match thresholds\.schema\.yaml at ulp_tolerance"
    ):
        amend(repo, "s", "r", ["protocol", "requant", "capture", "prediction", "compare", "faults"], "pre-data")


@pytest.mark.parametrize(
    ("stages", "status", "message"),
    [
        ([], "pre-data", "non-empty subset"),
        (["protocol", "typo"], "pre-data", "non-empty subset"),
        (["protocol"], "later", "status 'later'"),
    ],
)
def test_amend_checks_its_arguments(repo: Path, stages: list[str], status: str, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        amend(repo, "s", "r", stages, status)


def test_data_pin_through_the_cli(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The project's amendments may already pin data (A-0003 pins 'predictions'), so the artifact
    # pinned here gets a name no amendment pins yet: the unpinned state is made, not assumed.
    before = gate(repo).data_pins
    name = "predictions-rerun"
    assert name not in before
    artifact = repo / "results" / "prediction" / "predictions-rerun.parquet"
    artifact.parent.mkdir(parents=True)
    artifact.write_bytes(b"PAR1 stand-in bytes for the prediction list PAR1")
    assert pinned_data_digest(repo, name) is None
    with pytest.raises(ProtocolError, match=rf"predictions-rerun\.parquet: data artifact '{name}' is not pinned"):
        verify_data_pin(repo, name, artifact)
    argv = [
        "--root",
        str(repo),
        "--summary",
        "Pin the prediction list",
        "--rationale",
        "Before compare reads it.",
        "--stages",
        "compare",
        "--status",
        "pre-data",
        "--pin",
        f"{name}=results/prediction/predictions-rerun.parquet",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "wrote" in out
    # the next step: what to run, and that the record is to be committed
    assert "next: `snakemake -n` lists the stages that rerun (those reading a changed file, among: compare)" in out
    assert "git add amendments/ preregistration/ && git commit" in out
    assert pinned_data_digest(repo, name) == _sha(artifact)
    assert verify_data_pin(repo, name, artifact) == _sha(artifact)
    # The pins already in force carry over unchanged next to the new one.
    assert gate(repo).data_pins == {**before, name: _sha(artifact)}
    # A later amendment that pins nothing new keeps the pin in force.
    amend(repo, "Clarify", "Nothing changes but the record.", ["report"], "post-data")
    assert pinned_data_digest(repo, name) == _sha(artifact)
    artifact.write_bytes(artifact.read_bytes() + b"!")
    with pytest.raises(
        ProtocolError, match=rf"predictions-rerun\.parquet: sha256 .* is not the '{name}' artifact pinned"
    ):
        verify_data_pin(repo, name, artifact)


def test_cli_reports_errors_and_exits_nonzero(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--root",
        str(repo),
        "--summary",
        "s",
        "--rationale",
        "r",
        "--stages",
        "compare",
        "--status",
        "pre-data",
        "--pin",
        "predictions=results/missing.parquet",
    ]
    assert main(argv) == 1
    assert "results/missing.parquet: data artifact to pin does not exist" in capsys.readouterr().err


def test_amend_refuses_to_pin_a_protocol_file_that_is_a_link(repo: Path, tmp_path: Path) -> None:
    """A pinned link would certify a file that git does not hold (it records only the link)."""
    target = tmp_path / "elsewhere.yaml"
    path = repo / "preregistration" / "analysis.yaml"
    target.write_text(path.read_text().replace("resamples: 2000", "resamples: 4000", 1))
    path.unlink()
    path.symlink_to(target)
    count = len(list((repo / "amendments").glob("A-*.yaml")))
    with pytest.raises(ProtocolError, match=r"preregistration/analysis\.yaml.*link"):
        amend(repo, "Via a link", "Should be refused.", ALL_READERS_OF_ANALYSIS, "pre-data")
    assert len(list((repo / "amendments").glob("A-*.yaml"))) == count  # nothing written

"""`snakemake -n` must stop, naming the file, on every kind of protocol tampering (fails closed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import SNAKEMAKE, commit_all, dry_run

pytestmark = pytest.mark.slow  # every test here runs Snakemake


def _first_protocol_file(repo: Path) -> Path:
    return sorted((repo / "preregistration").glob("*.yaml"))[0]


def _assert_stopped(result, name: str) -> None:
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert name in out, out


def test_untampered_copy_dry_runs(project_copy: Path) -> None:
    result = dry_run(project_copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_edited_protocol_file(project_copy: Path) -> None:
    target = _first_protocol_file(project_copy)
    target.write_text(target.read_text().replace(":", ":  ", 1) + "\n# edited\n")
    _assert_stopped(dry_run(project_copy), target.name)


def test_whitespace_only_edit(project_copy: Path) -> None:
    target = _first_protocol_file(project_copy)
    target.write_text(target.read_text() + "\n")
    _assert_stopped(dry_run(project_copy), target.name)


def test_added_unpinned_file(project_copy: Path) -> None:
    extra = project_copy / "preregistration" / "late-idea.yaml"
    extra.write_text("note: added after the registration\n")
    _assert_stopped(dry_run(project_copy), "late-idea.yaml")


def test_deleted_pinned_file(project_copy: Path) -> None:
    target = _first_protocol_file(project_copy)
    target.unlink()
    _assert_stopped(dry_run(project_copy), target.name)


def test_edited_amendment(project_copy: Path) -> None:
    target = project_copy / "amendments" / "A-0001.yaml"
    target.write_text(target.read_text().replace("summary:", "summary: (revised)", 1))
    _assert_stopped(dry_run(project_copy), "A-0001.yaml")


def test_deleted_amendment(project_copy: Path) -> None:
    (project_copy / "amendments" / "A-0002.yaml").unlink()
    _assert_stopped(dry_run(project_copy), "A-0002.yaml")


def test_broken_parent_hash_without_git(project_copy_nogit: Path) -> None:
    target = project_copy_nogit / "amendments" / "A-0002.yaml"
    text = target.read_text()
    broken = re.sub(r"(previous_sha256:\s*['\"]?)([0-9a-f])",
                    lambda m: m.group(1) + ("0" if m.group(2) != "0" else "1"), text, count=1)
    assert broken != text
    target.write_text(broken)
    _assert_stopped(dry_run(project_copy_nogit), "A-0002.yaml")


def test_two_amendments_with_the_same_number(project_copy: Path) -> None:
    amendments = project_copy / "amendments"
    shutil.copy(amendments / "A-0002.yaml", amendments / "A-0002-copy.yaml")
    _assert_stopped(dry_run(project_copy), "A-0002")


def test_amendment_edited_in_an_earlier_commit_and_restored(project_copy: Path) -> None:
    target = project_copy / "amendments" / "A-0001.yaml"
    original = target.read_text()
    target.write_text(original + "# quietly changed\n")
    commit_all(project_copy, "edit an amendment")
    target.write_text(original)
    commit_all(project_copy, "restore it")
    _assert_stopped(dry_run(project_copy), "A-0001.yaml")


def test_gate_runs_on_plain_invocation_too(project_copy: Path) -> None:
    """Not only dry runs: any invocation that parses the Snakefile (listing rules) stops as well."""
    target = _first_protocol_file(project_copy)
    target.write_text(target.read_text() + " ")
    result = subprocess.run([str(SNAKEMAKE), "--list-rules"], cwd=project_copy, capture_output=True, text=True)
    _assert_stopped(result, target.name)

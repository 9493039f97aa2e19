"""Symbolic links in the protocol: git records a link, not what it points to, so an amendment or a
protocol file that is a link (committed or not, pointing inside the repository or out of it) could
change with nothing the append-only history check sees. The gate refuses each, naming it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from int8alibi.errors import ProtocolError
from int8alibi.protocol import gate
from int8alibi.tools.amend import amend

from .conftest import amendment_paths, commit_all


def _linked(path: Path, target: Path) -> None:
    """Move ``path`` to ``target`` and leave a symbolic link to it in its place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(path, target)
    path.symlink_to(target)


def test_a_committed_amendment_linked_to_a_file_outside_the_repository_is_refused(repo: Path, tmp_path: Path) -> None:
    path = amend(repo, "Clarify", "Nothing changes but the record.", ["report"], "post-data")
    outside = tmp_path / "elsewhere" / path.name
    _linked(path, outside)
    commit_all(repo, "an amendment that is a link")
    with pytest.raises(ProtocolError, match=rf"^amendments/{path.name}: a symbolic link \(to {outside}\); protocol "
                                            r"and amendment files must be the repository's own files"):
        gate(repo)
    outside.write_text(outside.read_text().replace("Clarify", "Rewritten"))  # what git would never see
    with pytest.raises(ProtocolError, match=rf"^amendments/{path.name}: a symbolic link"):
        gate(repo)


def test_a_new_amendment_linked_inside_the_repository_is_refused(repo: Path) -> None:
    path = amend(repo, "Clarify", "Nothing changes but the record.", ["report"], "post-data")
    _linked(path, repo / "docs" / path.name)
    relative = Path("..", "docs", path.name)
    path.unlink()
    path.symlink_to(relative)  # docs/ may change in any commit: the append-only rule would not see it
    with pytest.raises(ProtocolError, match=rf"^amendments/{path.name}: a symbolic link \(to {relative}\)"):
        gate(repo)
    commit_all(repo, "the link committed")
    with pytest.raises(ProtocolError, match=rf"^amendments/{path.name}: a symbolic link \(to {relative}\)"):
        gate(repo)
    latest = amendment_paths(repo)[-2]  # a committed record replaced by a link: history names the change
    _linked(latest, repo / "docs" / latest.name)
    with pytest.raises(ProtocolError, match=rf"^amendments/{latest.name}: uncommitted change \(changed in type\)"):
        gate(repo)


def test_a_protocol_file_linked_to_an_identical_copy_inside_the_repository_is_refused(repo: Path) -> None:
    target = repo / "preregistration" / "analysis.yaml"
    _linked(target, repo / "docs" / "analysis.yaml")  # the same bytes: every pin still matches
    with pytest.raises(ProtocolError, match=r"^preregistration/analysis\.yaml: a symbolic link \(to .*docs/"
                                            r"analysis\.yaml\)"):
        gate(repo)


@pytest.mark.parametrize("rel", ["amendments", "amendments/LOCK", "preregistration"])
def test_a_protocol_folder_or_the_lock_as_a_link_is_refused_without_git(unpacked: Path, tmp_path: Path,
                                                                       rel: str) -> None:
    moved = tmp_path / "moved" / rel
    _linked(unpacked / rel, moved)
    with pytest.raises(ProtocolError, match=rf"^{rel}/?: a symbolic link \(to {moved}\)"):
        gate(unpacked)


def test_a_committed_protocol_folder_that_is_a_link_is_refused(repo: Path, tmp_path: Path) -> None:
    moved = tmp_path / "moved" / "preregistration"
    _linked(repo / "preregistration", moved)
    commit_all(repo, "preregistration as a link")
    with pytest.raises(ProtocolError, match=rf"^preregistration/: a symbolic link \(to {moved}\)"):
        gate(repo)

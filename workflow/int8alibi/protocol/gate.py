"""The fail-closed protocol gate, run on every Snakemake invocation, and the pins it certifies.

Order matters only for the message: the git history is checked first, because an edited or
deleted amendment is best reported as exactly that; then the chain, the pins of the latest
amendment against the files, and finally the protocol's own content (schemas, cross-checks).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ProtocolError
from .chain import read_amendments, refuse_link, verify_chain, verify_pins
from .history import History, check_dates, check_history
from .load import Protocol, load
from .pins import PROTOCOL_DIR, data_digest, protocol_files_on_disk

log = logging.getLogger("int8alibi.protocol")


@dataclass(frozen=True)
class GateReport:
    """What the gate verified: the amendment in force, its pins, and the history-check outcome."""

    project_root: Path
    amendment: str
    amendments: tuple[str, ...]
    files: dict[str, str]
    data_pins: dict[str, str]
    history: History
    protocol: Protocol  # the verified protocol files, loaded (the config's names are checked against it)

    def summary(self) -> str:
        return (
            f"protocol verified: {len(self.files)} files pinned by {self.amendment} "
            f"({len(self.amendments)} amendments); {self.history.detail}"
        )

    def pins(self) -> dict[str, Any]:
        """The protocol in force as manifests record it."""
        return {
            "amendment": self.amendment,
            "files": dict(self.files),
            "data": dict(self.data_pins),
            "history": {
                "status": self.history.status,
                "detail": self.history.detail,
                "lock_commit": self.history.lock_commit,
            },
        }


def gate(project_root: Path) -> GateReport:
    """Verify history, chain, pins and content; raise ProtocolError naming the file and reason."""
    root = Path(project_root)
    history = check_history(root)
    amendments = read_amendments(root)
    verify_chain(amendments)
    check_dates(root, amendments)
    latest = amendments[-1]
    refuse_protocol_links(root)
    on_disk = protocol_files_on_disk(root)
    verify_pins(root, latest, on_disk)
    protocol = load(root / PROTOCOL_DIR)
    report = GateReport(
        project_root=root,
        amendment=latest.id,
        amendments=tuple(a.id for a in amendments),
        files=on_disk,
        data_pins=latest.data_pins,
        history=history,
        protocol=protocol,
    )
    if history.status != "verified":
        log.warning("protocol gate: %s", history.detail)
    return report


def refuse_protocol_links(project_root: Path) -> None:
    """No symbolic link in preregistration/ (the folder, its files, its subfolders): git records only
    the link, so a clone would not hold the protocol the pins certify, nor history show its edits."""
    folder = Path(project_root) / PROTOCOL_DIR
    refuse_link(folder, f"{PROTOCOL_DIR}/")
    for dirpath, dirs, files in os.walk(folder):  # links to folders are listed, never followed
        dirs.sort()  # the first link found, by name, is the one named
        for name in sorted([*dirs, *files]):
            path = Path(dirpath) / name
            refuse_link(path, path.relative_to(project_root).as_posix())


def current_pins(project_root: Path) -> dict[str, Any]:
    """The verified protocol in force: {"amendment", "files", "data", "history"}."""
    return gate(project_root).pins()


def pinned_data_digest(project_root: Path, name: str) -> str | None:
    """The digest the amendment in force pins for data artifact ``name``, or None if unpinned.

    The gate runs first, so a pin is only ever read from a verified chain. Whether an unpinned
    artifact may be read (an exploratory run) is the calling stage's decision; `verify_data_pin`
    is the strict form.
    """
    return gate(project_root).data_pins.get(name)


def verify_data_pin(project_root: Path, name: str, path: Path) -> str:
    """Check that the file at ``path`` is the pinned artifact ``name``; return its digest."""
    pinned = pinned_data_digest(project_root, name)
    if pinned is None:
        raise ProtocolError(
            f"{path}: data artifact {name!r} is not pinned by the amendment in force; pin it with "
            f"`int8alibi amend --pin {name}={path} ...` before a stage may read it"
        )
    actual = data_digest(Path(path))
    if actual != pinned:
        raise ProtocolError(
            f"{path}: sha256 {actual} is not the {name!r} artifact pinned by the amendment in force ({pinned})"
        )
    return actual

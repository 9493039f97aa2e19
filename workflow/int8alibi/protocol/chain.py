"""The amendment chain: read amendments/, check names, numbering and the previous-file hashes.

Each amendment records the SHA-256 of the previous amendment file, so editing any earlier record
breaks the link after it; the latest record pins every protocol file, so editing the protocol
without a new amendment breaks the pins.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import ProtocolError
from .pins import AMENDMENTS_DIR, LOCK_FILE, sha256_file
from .schema import read_yaml, validate

_NAME = re.compile(r"^A-(\d+)\.ya?ml$")


@dataclass(frozen=True)
class Amendment:
    """One amendment record and the hash of its file."""

    number: int
    rel: str
    sha256: str
    data: Mapping[str, Any]

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def pins(self) -> dict[str, str]:
        return dict(self.data["pins"])

    @property
    def data_pins(self) -> dict[str, str]:
        return dict(self.data.get("data_pins") or {})

    @property
    def data_pin_environments(self) -> dict[str, Any]:
        """Per pinned artifact, the environment it was made in (absent for pins made without one)."""
        return dict(self.data.get("data_pin_environments") or {})


def amendment_name(number: int) -> str:
    return f"A-{number:04d}"


def read_amendments(project_root: Path) -> list[Amendment]:
    """Every amendment under amendments/, schema-validated, ordered by number.

    Only A-NNNN.yaml files and the LOCK marker may live there; two files with the same number
    (e.g. A-0002.yaml and A-002.yaml) are an error, as is an id that disagrees with its file name.
    Nothing there (nor the folder) may be a symbolic link: git records the link, not what it points
    to, so the record could change with nothing the append-only history check sees.
    """
    folder = project_root / AMENDMENTS_DIR
    refuse_link(folder, f"{AMENDMENTS_DIR}/")
    if not folder.is_dir():
        raise ProtocolError(f"{AMENDMENTS_DIR}/: amendments folder not found under {project_root}")
    by_number: dict[int, Amendment] = {}
    for path in sorted(folder.iterdir()):
        rel = f"{AMENDMENTS_DIR}/{path.name}"
        refuse_link(path, rel)
        if rel == LOCK_FILE:
            continue
        match = _NAME.match(path.name)
        if match is None or not path.is_file():
            raise ProtocolError(
                f"{rel}: unexpected entry in {AMENDMENTS_DIR}/ (only A-NNNN.yaml records and LOCK belong there)"
            )
        number = int(match.group(1))
        if number in by_number:
            raise ProtocolError(f"{rel}: amendment number {number} is already used by {by_number[number].rel}")
        expected = f"{amendment_name(number)}.yaml"
        if path.name != expected:
            raise ProtocolError(f"{rel}: amendment files are named {expected}")
        data = read_yaml(path, rel)
        validate(data, "amendment.schema.yaml", rel)
        if data["id"] != amendment_name(number):
            raise ProtocolError(
                f"{rel}: id {data['id']} does not match the file name (expected {amendment_name(number)})"
            )
        for key in data["pins"]:
            parts = PurePosixPath(key).parts
            if ".." in parts or "." in parts or key != PurePosixPath(key).as_posix():
                raise ProtocolError(f"{rel}: pin {key!r} is not a normalized path under preregistration/")
        by_number[number] = Amendment(number=number, rel=rel, sha256=sha256_file(path), data=data)
    return [by_number[n] for n in sorted(by_number)]


def refuse_link(path: Path, rel: str) -> None:
    """A protocol or amendment file (or its folder) that is a symbolic link is a ProtocolError naming it."""
    if path.is_symlink():
        raise ProtocolError(f"{rel}: a symbolic link (to {os.readlink(path)}); protocol and amendment files must be "
                            "the repository's own files (git records only the link, not a change to its target)")


def amendment_date(amendment: Amendment) -> dt.date:
    """The amendment's ``date`` as a calendar date (``2026-13-45`` is refused naming the file)."""
    try:
        return dt.date.fromisoformat(str(amendment.data["date"]))
    except ValueError:
        raise ProtocolError(f"{amendment.rel}: date {amendment.data['date']!r} is not a calendar date "
                            "(YYYY-MM-DD)") from None


def verify_chain(amendments: list[Amendment]) -> None:
    """Numbers consecutive from A-0001, each previous_sha256 equal to the previous file's hash."""
    if not amendments:
        raise ProtocolError(
            f"{AMENDMENTS_DIR}/: no amendment found; the protocol must be registered as {amendment_name(1)}.yaml"
        )
    for position, amendment in enumerate(amendments, start=1):
        amendment_date(amendment)  # a calendar date, else named here
        if amendment.number != position:
            raise ProtocolError(
                f"{amendment.rel}: {amendment_name(position)} is missing; amendments are numbered "
                f"consecutively from {amendment_name(1)}"
            )
        previous = amendment.data["previous_sha256"]
        if position == 1:
            if previous is not None:
                raise ProtocolError(f"{amendment.rel}: the first amendment must have previous_sha256: null")
            if amendment.data["status"] != "pre-data":
                raise ProtocolError(f"{amendment.rel}: the original registration must be pre-data")
            continue
        before = amendments[position - 2]
        if previous != before.sha256:
            raise ProtocolError(
                f"{amendment.rel}: previous_sha256 {previous} does not match {before.rel} "
                f"(sha256 {before.sha256}); an earlier amendment was changed or the link is wrong"
            )
        if amendment_date(amendment) < amendment_date(before):
            raise ProtocolError(
                f"{amendment.rel}: dated {amendment.data['date']}, before {before.rel} ({before.data['date']})"
            )


def _others(items: list[str]) -> str:
    return f" (and {len(items) - 1} more: {', '.join(items[1:])})" if len(items) > 1 else ""


def verify_pins(project_root: Path, latest: Amendment, on_disk: Mapping[str, str]) -> None:
    """Every protocol file equals its pin in the latest amendment; none unpinned, none missing."""
    pinned = latest.pins
    unpinned = sorted(set(on_disk) - set(pinned))
    if unpinned:
        raise ProtocolError(
            f"{unpinned[0]}: protocol file is not pinned by {latest.rel}{_others(unpinned)}; "
            "change the protocol only through a new amendment"
        )
    missing = sorted(set(pinned) - set(on_disk))
    if missing:
        raise ProtocolError(f"{missing[0]}: pinned by {latest.rel} but missing from {project_root}{_others(missing)}")
    changed = sorted(rel for rel in pinned if on_disk[rel] != pinned[rel])
    if changed:
        rel = changed[0]
        raise ProtocolError(
            f"{rel}: sha256 {on_disk[rel]} differs from its pin {pinned[rel]} in {latest.rel}"
            f"{_others(changed)} (any byte counts, whitespace included); restore it or record the "
            "change in a new amendment"
        )

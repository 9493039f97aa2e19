"""Where the protocol lives, which stage reads which protocol file, and how pins are hashed.

A pin is the SHA-256 of a file's bytes, so any edit (whitespace included) changes it. Data
artifacts (e.g. the prediction list) are pinned with the same definition: the SHA-256 of the
file as written. The project's Parquet writer is deterministic, so rerunning a stage on the same
data and library versions reproduces the pin; anything else is a different artifact that needs a
new amendment.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .. import stage_spec
from ..errors import ProtocolError

PROTOCOL_DIR = "preregistration"
AMENDMENTS_DIR = "amendments"
LOCK_FILE = f"{AMENDMENTS_DIR}/LOCK"

FAULTS = f"{PROTOCOL_DIR}/faults.yaml"
CHECKS = f"{PROTOCOL_DIR}/checks.yaml"
THRESHOLDS = f"{PROTOCOL_DIR}/thresholds.yaml"
ANALYSIS = f"{PROTOCOL_DIR}/analysis.yaml"
PREDICTIONS_ORIGINAL = f"{PROTOCOL_DIR}/predictions-original.yaml"
PREDICTIONS_CORRECTED = f"{PROTOCOL_DIR}/predictions-corrected.yaml"
TOKENS = f"{PROTOCOL_DIR}/tokens.yaml"
PAPER = f"{PROTOCOL_DIR}/paper.yaml"
KSWEEP = f"{PROTOCOL_DIR}/ksweep.yaml"
BATCH = f"{PROTOCOL_DIR}/batch.yaml"

PROTOCOL_FILES: tuple[str, ...] = (
    ANALYSIS,
    BATCH,
    CHECKS,
    FAULTS,
    KSWEEP,
    PAPER,
    PREDICTIONS_CORRECTED,
    PREDICTIONS_ORIGINAL,
    THRESHOLDS,
    TOKENS,
)

# Protocol files each stage reads, as names inside preregistration/ (a rule's inputs are
# preregistration/<name>), from its entry in ``int8alibi.stage_spec``; a stage that does a share of
# another's work (``Stage.part_of``) reads that one's and is amended with it. A rule declares exactly
# these, so an amendment reruns the stages whose files it changed and whatever depends on them.
STAGE_FILES: dict[str, list[str]] = {s.name: list(s.protocol) for s in stage_spec.STAGES if not s.part_of}


def stage_reads(stage: str) -> list[str]:
    """The protocol files a stage reads, as paths relative to the project root."""
    return [f"{PROTOCOL_DIR}/{name}" for name in STAGE_FILES[stage]]


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


PREDICTIONS_PIN = "predictions"


def predictions_pin(results: str) -> str:
    """The data pin a run's per-layer predictions go under: ``predictions`` for the default results
    folder, ``predictions@<results>`` for any other (the config's ``results`` as written). One pin per
    run, so pinning Qwen3-8B's predictions leaves the default model's and Qwen3-1.7B's in force."""
    return PREDICTIONS_PIN if results == "results" else f"{PREDICTIONS_PIN}@{results}"


def data_digest(path: Path) -> str:
    """The digest an amendment records for a pinned data artifact: SHA-256 of its bytes."""
    if not Path(path).is_file():
        raise ProtocolError(f"{path}: data artifact to pin does not exist or is not a file")
    return sha256_file(Path(path))


def protocol_files_on_disk(project_root: Path) -> dict[str, str]:
    """Every file under preregistration/ (recursively, hidden files too) -> its SHA-256.

    Keys are POSIX paths relative to the project root. Everything in the folder is protocol:
    a file that is not pinned is an error, not something to skip.
    """
    folder = project_root / PROTOCOL_DIR
    if not folder.is_dir():
        raise ProtocolError(f"{PROTOCOL_DIR}/: protocol folder not found under {project_root}")
    found: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(project_root).as_posix()
        if path.is_dir() and not path.is_symlink():
            continue
        if not path.is_file():
            raise ProtocolError(f"{rel}: not a regular file (broken link or special file) in the protocol folder")
        if path.is_symlink() and not path.resolve().is_relative_to(project_root.resolve()):
            raise ProtocolError(f"{rel}: a symbolic link to {path.resolve()}, outside the project; the protocol is "
                                "the project's own files")
        found[rel] = sha256_file(path)
    return found

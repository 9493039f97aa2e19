"""The manifest file format: its name, required keys and digest, and the reader that checks them.

``manifest.write_manifest`` writes this format, ``chain`` follows the links between manifests and
``audit`` re-verifies them; all three read a manifest through ``load_manifest`` here, so a
malformed one is refused the same way everywhere.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import ManifestError
from ..files.hashing import canonical_json, open_regular, sha256_bytes

MANIFEST_NAME = "manifest.json"
FORMAT = "int8alibi-manifest/2"  # /2: adds ``upstream`` (the manifest chain)
TIMESTAMP_KEYS = ("recorded_at",)
REQUIRED_KEYS = ("format", "stage", "stage_dir", "outputs", "inputs", "params", "protocol", "code",
                 "environment", "arms", "exploratory", "extra", "upstream", "digest")


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of everything except ``digest`` and the timestamps."""
    body = {k: v for k, v in manifest.items() if k != "digest" and k not in TIMESTAMP_KEYS}
    return sha256_bytes(canonical_json(body).encode())


def load_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a manifest; a file that is not one (bad JSON, wrong format, missing keys) names itself."""
    p = Path(path)
    try:
        with open_regular(p, ManifestError) as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except OSError as exc:
        raise ManifestError(f"{p}: cannot be read ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{p}: not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise ManifestError(f"{p}: not a manifest (JSON nested too deeply to read)") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        older = isinstance(data, dict) and data.get("format") == "int8alibi-manifest/1"
        raise ManifestError(f"{p}: not an {FORMAT} manifest" + (
            " (written before manifests recorded their upstream manifests; rerun the stage)" if older else ""))
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ManifestError(f"{p}: manifest lacks key(s) {missing}")
    for key in ("stage", "stage_dir", "digest"):
        if not isinstance(data[key], str) or not data[key]:
            raise ManifestError(f"{p}: {key} must be a non-empty string")
    if ".." in PurePosixPath(data["stage_dir"]).parts:
        raise ManifestError(f"{p}: stage_dir {data['stage_dir']!r} contains '..'")
    pins = data["protocol"].get("pins", {}) if isinstance(data["protocol"], dict) else None
    if not isinstance(pins, dict) or not _str_map(pins.get("files", {})) or not isinstance(pins.get("data", {}), dict):
        raise ManifestError(f"{p}: protocol must be a mapping whose pins map files to digests")
    for role, needs in (("outputs", ("path", "sha256")), ("inputs", ("path", "sha256")),
                        ("upstream", ("manifest", "digest"))):
        records = data[role]
        if not isinstance(records, list) or not all(
                isinstance(r, dict) and all(isinstance(r.get(k), str) and r[k] for k in needs) for r in records):
            raise ManifestError(f"{p}: {role} must be a list of records, each with string {' and '.join(needs)}")
        for rec in records:
            if rec.get("kind") == "dir" and not _str_map(rec.get("files")):
                raise ManifestError(f"{p}: {role} folder {rec['path']!r} must map its files to digests")
        keys = [r["manifest" if role == "upstream" else "path"] for r in records]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:  # a writer never lists one twice (``_records``): the manifest was edited
            raise ManifestError(f"{p}: {role} record {repeated[0]!r} is listed more than once")
    return data


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def resolve_recorded(recorded: str, manifest_path: Path, stage_dir: str,
                     project_root: Path | None = None) -> Path:
    """Where a recorded path lies now, given where its manifest was found.

    Paths inside the stage folder (or inside the results folder above it) are found relative to
    the manifest, so a renamed or copied results tree still verifies; other relative paths are
    relative to the project root, which is inferred from the recorded ``stage_dir`` unless given.
    """
    rec = PurePosixPath(recorded)
    stage = PurePosixPath(stage_dir)
    here = manifest_path.absolute().parent
    if rec.is_relative_to(stage):
        return here.joinpath(*rec.relative_to(stage).parts)
    if not stage.is_absolute() and len(stage.parts) > 1 and rec.is_relative_to(stage.parent):
        return here.parent.joinpath(*rec.relative_to(stage.parent).parts)
    if rec.is_absolute():
        return Path(rec)
    return (project_root or inferred_root(manifest_path, stage_dir)).joinpath(*rec.parts)


def inferred_root(manifest_path: Path, stage_dir: str) -> Path:
    """The project root implied by the manifest's location and its recorded ``stage_dir``."""
    stage = PurePosixPath(stage_dir)
    if stage.is_absolute():
        return Path.cwd()
    parents = manifest_path.absolute().parents
    if len(stage.parts) >= len(parents):
        raise ManifestError(f"{manifest_path}: stage_dir {stage_dir!r} is deeper than where the manifest lies")
    return parents[len(stage.parts)]

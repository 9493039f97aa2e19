"""Stage manifests: what a stage read, wrote, assumed and ran, each item identified by SHA-256.

``results/<stage>/manifest.json`` lets a reviewer re-verify a run without rerunning it
(``int8alibi verify``) and explain why two runs differ (``int8alibi diff``). Its ``digest``
covers everything except timestamps, so an edit to the manifest itself is detectable and two
manifests of identical runs have the same digest. ``upstream`` records the digests of the manifests
its inputs came from (``int8alibi.provenance.chain``), so the last manifest commits to the whole run.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import InputError, ManifestError
from . import environment
from .atomic import write_bytes
from .hashing import (canonical_json, listing_digest, open_regular, package_digest, sha256_bytes, sha256_file,
                      stage_code_digest, tree_hashes)
from .parquet import content_digest, read_arrow, schema_digest

MANIFEST_NAME = "manifest.json"
FORMAT = "int8alibi-manifest/2"  # /2: adds ``upstream`` (the manifest chain)
TIMESTAMP_KEYS = ("recorded_at",)
REQUIRED_KEYS = ("format", "stage", "stage_dir", "outputs", "inputs", "params", "protocol", "code",
                 "environment", "arms", "exploratory", "extra", "upstream", "digest")

PathLike = str | os.PathLike[str]

# The config file the running stage read (``stage_main`` sets it): recorded as an input of its manifest,
# so a run config edited after the run (its ``resolved`` block: host, arms) no longer verifies.
RUN_CONFIG: ContextVar[Path | None] = ContextVar("run_config", default=None)
RUN_CONFIG_INPUT = "run config"


def record_path(path: PathLike, project_root: Path) -> str:
    """Posix path relative to the project root, or absolute when it lies outside (a model directory)."""
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(project_root.resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


def file_record(path: PathLike, project_root: Path, *, tables: bool) -> dict[str, Any]:
    """Path, kind, sha256 and size of a file or directory; Parquet files also get row count and
    schema and content digests when ``tables`` (so a re-encoding is told apart from a change)."""
    p = Path(path)
    rec: dict[str, Any] = {"path": record_path(p, project_root)}
    if p.is_dir():
        files = tree_hashes(p)
        rec.update(kind="dir", sha256=listing_digest(files), files=files,
                   bytes=sum((p / rel).stat().st_size for rel in files))
    elif p.is_file():
        rec.update(kind="file", sha256=sha256_file(p), bytes=p.stat().st_size)
        if tables and p.suffix == ".parquet":
            table = read_arrow(p)
            rec.update(rows=table.num_rows, columns=table.num_columns,
                       schema_digest=schema_digest(table.schema), content_digest=content_digest(table))
    else:
        raise ManifestError(f"{p}: named in the manifest but does not exist")
    return rec


def _records(items: Mapping[str, PathLike] | Iterable[PathLike], project_root: Path, *, tables: bool,
             role: str, manifest_path: Path) -> list[dict[str, Any]]:
    named = items.items() if isinstance(items, Mapping) else ((None, p) for p in items)
    records: list[dict[str, Any]] = []
    for name, path in named:
        if Path(path).resolve() == manifest_path.resolve():
            raise ManifestError(f"{manifest_path}: the manifest cannot list itself as an {role}")
        rec = file_record(path, project_root, tables=tables)
        if name is not None:
            rec["name"] = str(name)
        records.append(rec)
    paths = [r["path"] for r in records]
    repeated = sorted({p for p in paths if paths.count(p) > 1})
    if repeated:
        raise ManifestError(f"{manifest_path}: {role} {repeated[0]} is listed more than once")
    return sorted(records, key=lambda r: r["path"])


def protocol_pins(project_root: Path) -> dict[str, Any]:
    """The protocol in force, from ``int8alibi.protocol.current_pins`` (imported when needed)."""
    try:
        protocol = importlib.import_module("int8alibi.protocol")
        current_pins = protocol.current_pins
    except (ImportError, AttributeError) as exc:
        raise ManifestError(f"cannot record the protocol in force: int8alibi.protocol.current_pins "
                            f"is unavailable ({exc})") from exc
    return dict(current_pins(project_root))


def _stage_digest(stage: str) -> str:
    module = f"int8alibi.stages.{stage.replace('-', '_')}"
    try:
        return stage_code_digest([module])
    except InputError:
        return f"not applicable: no module {module}"


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of everything except ``digest`` and the timestamps."""
    body = {k: v for k, v in manifest.items() if k != "digest" and k not in TIMESTAMP_KEYS}
    return sha256_bytes(canonical_json(body).encode())


def _plain(value: Any, what: str, manifest_path: Path) -> Any:
    """The JSON round trip of ``value``, so the written manifest re-hashes to the same digest."""
    try:
        return json.loads(canonical_json(value))
    except (TypeError, ValueError) as exc:
        raise ManifestError(f"{manifest_path}: {what} cannot be recorded as JSON ({exc})") from exc


def write_manifest(stage_dir: PathLike, *, stage: str,
                   outputs: Mapping[str, PathLike] | Sequence[PathLike],
                   inputs: Mapping[str, PathLike] | Sequence[PathLike],
                   params: Mapping[str, Any], arms: Sequence[Mapping[str, Any]] = (),
                   exploratory: bool = False, protocol_root: PathLike = "preregistration",
                   extra: Mapping[str, Any] | None = None, device: Any = None) -> Path:
    """Write ``<stage_dir>/manifest.json`` atomically and return its path.

    The project root is the directory holding ``protocol_root``; paths under it are recorded
    relative to it. Every output and input must exist. ``device`` (torch.device or config
    string, None = auto) is the device whose facts go into the environment record.
    """
    from .chain import upstream_of  # chain reads manifests with this module's loader

    out_dir = Path(stage_dir)
    manifest_path = out_dir / MANIFEST_NAME
    root = Path(protocol_root).resolve().parent
    if not isinstance(exploratory, bool):
        raise ManifestError(f"{manifest_path}: exploratory must be a bool, got {exploratory!r}")
    for i, arm in enumerate(arms):
        if not isinstance(arm, Mapping):
            raise ManifestError(f"{manifest_path}: arms[{i}] must be a mapping of evidence, "
                                f"got {type(arm).__name__}")
    inputs = dict(inputs) if isinstance(inputs, Mapping) else list(inputs)
    run_config = RUN_CONFIG.get()
    if run_config is not None:  # the config the stage read (its resolved block too) is an input like any other
        inputs = ({**inputs, RUN_CONFIG_INPUT: run_config} if isinstance(inputs, dict) else [*inputs, run_config])
    input_records = _records(inputs, root, tables=False, role="input", manifest_path=manifest_path)
    by_path = {r["path"]: r for r in input_records}
    input_paths = inputs.values() if isinstance(inputs, Mapping) else inputs
    upstream = upstream_of([(Path(p), by_path[record_path(p, root)]) for p in input_paths], out_dir,
                           lambda m: record_path(m, root))
    env = environment.collect(device, root)
    body: dict[str, Any] = {
        "format": FORMAT,
        "stage": stage,
        "stage_dir": record_path(out_dir, root),
        "outputs": _records(outputs, root, tables=True, role="output", manifest_path=manifest_path),
        "inputs": input_records,
        "upstream": upstream,
        "params": _plain(dict(params), "params", manifest_path),
        "protocol": {"root": record_path(protocol_root, root),
                     "pins": _plain(protocol_pins(root), "protocol pins", manifest_path)},
        "code": {"git": env.pop("git"), "package_digest": package_digest(),
                 "stage_digest": _stage_digest(stage)},
        "environment": _plain(env, "environment", manifest_path),
        "arms": _plain([dict(a) for a in arms], "arms", manifest_path),
        "exploratory": exploratory,
        "extra": _plain(dict(extra) if extra is not None else None, "extra", manifest_path),
    }
    body = _plain(body, "manifest", manifest_path)
    body["digest"] = manifest_digest(body)
    body["recorded_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    text = json.dumps(body, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    return write_bytes(manifest_path, text.encode())


def load_manifest(path: PathLike) -> dict[str, Any]:
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

"""Stage manifests: what a stage read, wrote, assumed and ran, each item identified by SHA-256.

``results/<stage>/manifest.json`` lets a reviewer re-verify a run without rerunning it
(``int8alibi verify``) and explain why two runs differ (``int8alibi diff``). Its ``digest``
covers everything except timestamps, so an edit to the manifest itself is detectable and two
manifests of identical runs have the same digest. ``upstream`` records the digests of the manifests
its inputs came from (``int8alibi.provenance.chain``), so the last manifest commits to the whole run.
The format and its reader are ``manifest_format``; this module writes it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import InputError, ManifestError, ProtocolError
from .. import protocol
from ..protocol.pins import AMENDMENTS_DIR, PROTOCOL_DIR
from . import environment
from ..files.atomic import write_bytes
from .chain import upstream_of
from ..files.hashing import canonical_json, listing_digest, package_digest, sha256_file, stage_code_digest, tree_hashes
from .manifest_format import FORMAT, MANIFEST_NAME, manifest_digest
from ..files.parquet import content_digest, read_arrow, schema_digest


PathLike = str | os.PathLike[str]

# The config file the running stage read (``stage_main`` sets it): recorded as an input of its manifest,
# so a run config edited after the run (its ``resolved`` block: host, arms) no longer verifies.
RUN_CONFIG: ContextVar[Path | None] = ContextVar("run_config", default=None)
RUN_CONFIG_INPUT = "run config"

# The protocol's files as the running stage found them when it started (``stage_main`` binds them):
# a manifest is refused when they changed since, as the stage's results were computed under the old ones.
PROTOCOL_AT_START: ContextVar[tuple[Path, dict[str, str]] | None] = ContextVar("protocol_at_start", default=None)


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
    """The protocol in force (``protocol.current_pins``), as the manifest records it."""
    return dict(protocol.current_pins(project_root))


def protocol_state(project_root: Path) -> dict[str, str]:
    """Every entry under the protocol and amendments folders -> its SHA-256 (a link or other non-file:
    its kind), cheap enough to take when a stage starts; any edit, addition or removal changes it."""
    state: dict[str, str] = {}
    for folder in (PROTOCOL_DIR, AMENDMENTS_DIR):
        for path in sorted((project_root / folder).rglob("*")):
            mode = path.lstat().st_mode
            rel = path.relative_to(project_root).as_posix()
            if stat.S_ISREG(mode):
                state[rel] = sha256_file(path)
            elif not stat.S_ISDIR(mode):
                state[rel] = f"not a file ({'a link to ' + os.readlink(path) if stat.S_ISLNK(mode) else oct(mode)})"
    return state


@contextmanager
def bind_protocol(project_root: Path) -> Iterator[None]:
    """Within the block, a manifest of ``project_root``'s protocol is written only if the protocol's
    files are still those found on entering (``PROTOCOL_AT_START``)."""
    root = Path(project_root).resolve()
    token = PROTOCOL_AT_START.set((root, protocol_state(root)))
    try:
        yield
    finally:
        PROTOCOL_AT_START.reset(token)


def _check_protocol_unchanged(root: Path, stage: str, manifest_path: Path) -> None:
    """``ProtocolError`` when the protocol bound at the stage's start (same project) changed since."""
    bound = PROTOCOL_AT_START.get()
    if bound is None or bound[0] != root:
        return
    before, now = bound[1], protocol_state(root)
    changed = [f"{rel} {'added' if rel not in before else 'removed' if rel not in now else 'changed'}"
               for rel in sorted(set(before) | set(now)) if before.get(rel) != now.get(rel)]
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise ProtocolError(f"{manifest_path}: the protocol changed while stage {stage} ran ({', '.join(changed[:3])}"
                            f"{more}); its results were computed under the protocol as it was when it started, "
                            "so they are not recorded under the new one: run the stage again")


def _stage_digest(stage: str) -> str:
    module = f"int8alibi.stages.{stage.replace('-', '_')}"
    try:
        return stage_code_digest([module])
    except InputError:
        return f"not applicable: no module {module}"


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
    _check_protocol_unchanged(root, stage, manifest_path)  # after the pins were read: they are the start's
    return write_bytes(manifest_path, text.encode())



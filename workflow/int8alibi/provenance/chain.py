"""The manifest chain: a stage trusts another stage's files only as that stage's manifest records them.

An input that lies in another stage's folder is checked against that folder's ``manifest.json``
before the stage reads it (``verify_input``), and every manifest records the digests of the
manifests its inputs came from (``upstream_links``). So the last manifest of a run commits to every
byte before it, and a file edited after its stage ran stops the next stage instead of flowing on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from .. import stage_spec
from ..errors import Int8AlibiError, ManifestError
from ..files.hashing import listing_digest, sha256_file, tree_hashes
from .manifest_format import MANIFEST_NAME, load_manifest, manifest_digest, resolve_recorded
from ..files.transaction import SUFFIX as SNAPSHOT_SUFFIX

PROJECT_MARKER = "preregistration"  # a folder holding it is a project root: the search stops there
RUN_STATE = ".run"  # every run's results folder holds one from its planning on (``config.run_config_path``)

# Stages the pipeline always feeds from another stage of the same run (``stage_spec.Stage.requires``):
# where that stage's folder is present beside them, their manifest must record it upstream (an emptied
# ``upstream`` list whose digest was recomputed is refused even when the inputs were stripped too).
REQUIRED_UPSTREAM: Mapping[str, tuple[str, ...]] = {s.name: s.requires for s in stage_spec.STAGES if s.requires}


def _abs(path: str | os.PathLike[str]) -> Path:
    """Absolute and normalised, symlinks kept (a symlink must be seen, not followed)."""
    return Path(os.path.abspath(path))


def stage_manifest_of(path: str | os.PathLike[str], own_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The manifest of the stage folder holding ``path``: the nearest ``manifest.json`` in ``path``
    (a folder) or above it, skipping ``own_dir`` (the reading stage's own, earlier manifest) and
    stopping at a project root. ``path`` itself when it is a manifest. None: no stage wrote it."""
    p, own = _abs(path), (_abs(own_dir) if own_dir is not None else None)
    if p.name == MANIFEST_NAME and p.parent != own:
        return p
    start = p if p.is_dir() else p.parent
    for folder in (start, *start.parents):
        if folder != own and (folder / MANIFEST_NAME).exists():
            return folder / MANIFEST_NAME
        if (folder / PROJECT_MARKER).is_dir():
            return None
    return None


def check_record(rec: Mapping[str, Any], path: Path) -> list[str]:
    """Reasons why the file or folder at ``path`` no longer matches its record (empty: it matches)."""
    if path.is_symlink():
        return [f"is a symbolic link (to {os.readlink(path)}); a stage writes regular files only"]
    if rec.get("kind") == "dir":
        if not path.is_dir():
            return [f"missing (recorded folder, now {'a file' if path.exists() else 'absent'})"]
        now = tree_hashes(path)
        then: Mapping[str, str] = rec.get("files", {})
        reasons = [f"file {rel} missing" for rel in sorted(set(then) - set(now))]
        reasons += [f"file {rel} added" for rel in sorted(set(now) - set(then))]
        reasons += [f"file {rel} changed (recorded {then[rel]}, now {now[rel]})"
                    for rel in sorted(set(now) & set(then)) if now[rel] != then[rel]]
        reasons += [f"file {rel} is a symbolic link" for rel in sorted(now) if (path / rel).is_symlink()]
        if not reasons and listing_digest(now) != rec["sha256"]:
            reasons.append(f"folder digest changed (recorded {rec['sha256']}, now {listing_digest(now)})")
        return reasons
    if path.is_dir():
        return ["a folder is where this file was recorded"]
    if not path.is_file():
        return ["missing" if not path.exists() else "not a regular file (a FIFO, socket or device)"]
    now_sha = sha256_file(path)
    if now_sha == rec["sha256"]:
        return []
    return [f"sha256 changed (recorded {rec['sha256']}, now {now_sha}; bytes {rec.get('bytes')} -> "
            f"{path.stat().st_size})"]


def load_checked(manifest_path: Path) -> dict[str, Any]:
    """A manifest whose recorded digest matches its content (else ManifestError naming it)."""
    manifest = load_manifest(manifest_path)
    if manifest_digest(manifest) != manifest["digest"]:
        raise ManifestError(f"{manifest_path}: digest mismatch (recorded {manifest['digest']}, computed "
                            f"{manifest_digest(manifest)}): the manifest was edited after it was written")
    return manifest


def _located(manifest_path: Path, manifest: Mapping[str, Any], role: str) -> list[tuple[dict[str, Any], Path]]:
    """(record, where its file is now) for every record of ``role``; a path that climbs out is refused."""
    out = []
    for rec in manifest[role]:
        if not isinstance(rec, Mapping) or not isinstance(rec.get("path"), str) or not rec["path"]:
            raise ManifestError(f"{manifest_path}: {role} record {rec!r} has no path")
        if ".." in PurePosixPath(rec["path"]).parts:
            raise ManifestError(f"{manifest_path}: {role[:-1]} {rec['path']!r} contains '..'")
        out.append((dict(rec), _abs(resolve_recorded(rec["path"], manifest_path, manifest["stage_dir"]))))
    return out


def _covers(where: Path, rec: Mapping[str, Any], path: Path) -> bool:
    return where == path or (rec.get("kind") == "dir" and where in path.parents) or path in where.parents


def upstream_links(manifest_path: Path, manifest: Mapping[str, Any]) -> list[str]:
    """Reasons why the manifests this one recorded as upstream are no longer the ones present."""
    reasons = []
    for link in manifest.get("upstream", []):
        if not isinstance(link, Mapping) or not isinstance(link.get("manifest"), str):
            reasons.append(f"upstream record {link!r} is malformed")
            continue
        if ".." in PurePosixPath(link["manifest"]).parts:
            reasons.append(f"upstream manifest {link['manifest']!r} contains '..'")
            continue
        where = resolve_recorded(link["manifest"], manifest_path, manifest["stage_dir"])
        try:
            now = load_manifest(where)["digest"]
        except ManifestError as exc:
            reasons.append(f"upstream manifest {link['manifest']}: {exc}")
            continue
        if now != link.get("digest"):
            reasons.append(f"chain broken: upstream manifest {where} has digest {now}, but this manifest "
                           f"recorded {link.get('digest')} (the upstream stage was rerun or its manifest "
                           f"rewritten after this stage read it)")
    return reasons


def missing_links(manifest_path: Path, manifest: Mapping[str, Any],
                  inputs: Iterable[tuple[Mapping[str, Any], Path]]) -> list[str]:
    """Upstream links the manifest should hold and does not: one per stage folder an input lies in, and
    one per ``REQUIRED_UPSTREAM`` stage whose folder lies beside this stage's."""
    here = _abs(manifest_path)
    linked = {_abs(resolve_recorded(link["manifest"], manifest_path, manifest["stage_dir"]))
              for link in manifest.get("upstream", []) if isinstance(link, Mapping)
              and isinstance(link.get("manifest"), str)}
    reasons = []
    for rec, where in inputs:
        upstream = stage_manifest_of(where, here.parent)
        if upstream is not None and upstream.exists() and _abs(upstream) not in linked:
            reasons.append(f"input {rec['path']} lies in the folder of the stage whose manifest is {upstream}, "
                           "but no upstream link records that manifest (the link was removed)")
    for stage in REQUIRED_UPSTREAM.get(str(manifest["stage"]), ()):
        beside = here.parent.parent / stage / MANIFEST_NAME
        if beside.is_file() and _abs(beside) not in linked:
            reasons.append(f"stage {manifest['stage']!r} always reads stage {stage!r}'s outputs and {beside} is "
                           "present, but no upstream link records it (the link was removed)")
    return reasons


def verify_input(path: str | os.PathLike[str], own_dir: str | os.PathLike[str] | None = None, *,
                 whole: bool = True) -> list[Path]:
    """Check an input against the manifest(s) of the stage(s) that wrote it, before it is read.

    The input's stage manifest must be intact, list the input, and its files must still hash to
    their records (with ``whole``, every output of that manifest: stages read siblings of the file
    they are given); its own upstream links must still hold. A folder holding stage folders (the
    results folder) is checked per direct sub-folder (nested stages such as faults shards are
    vouched for by their parent stage's upstream links). Returns the manifests checked; raises
    ManifestError naming the input and the manifest.
    """
    p, own = _abs(path), (_abs(own_dir) if own_dir is not None else None)
    manifest_path = stage_manifest_of(p, own)
    if manifest_path is not None:
        targets = [manifest_path]
    elif p.is_dir():
        targets = sorted(m for m in (_abs(m) for m in p.glob(f"*/{MANIFEST_NAME}")) if m.parent != own)
    else:
        targets = []
    for target in targets:
        manifest = load_checked(target)
        records = _located(target, manifest, "outputs")
        if manifest_path is not None and p != target:
            covering = [(rec, where) for rec, where in records if _covers(where, rec, p)]
            if not covering:
                raise ManifestError(f"{p}: lies in the folder of stage {manifest['stage']!r} but its manifest "
                                    f"{target} does not list it")
            if not whole:
                records = covering
        for rec, where in records:
            reasons = check_record(rec, where)
            if reasons:
                raise ManifestError(f"{where}: does not match the manifest {target} of stage {manifest['stage']!r} "
                                    f"({'; '.join(reasons[:3])}); it changed after that stage wrote it, so "
                                    f"rerun stage {manifest['stage']!r} (or restore the file)")
        broken = upstream_links(target, manifest)
        if broken:
            raise ManifestError(f"{target}: {broken[0]}")
    return targets


def upstream_of(inputs: Iterable[tuple[Path, Mapping[str, Any]]], own_dir: Path,
                record: Callable[[Path], str]) -> list[dict[str, str]]:
    """The ``upstream`` block of a manifest being written: ``[{stage, manifest, digest}]`` of every
    stage folder its inputs lie in. ``inputs`` are (path, its input record, already hashed);
    an input that differs from its stage manifest's record, or that the manifest does not list, is
    refused naming both. ``record`` turns a path into its recorded form."""
    links: dict[str, dict[str, str]] = {}
    for path, rec in inputs:
        manifest_path = stage_manifest_of(path, own_dir)
        if manifest_path is None:
            continue
        try:
            manifest = load_checked(manifest_path)
        except Int8AlibiError as exc:
            raise ManifestError(f"{path}: its stage manifest cannot be trusted: {exc}") from exc
        p = _abs(path)
        if p != manifest_path:
            covering = [(r, w) for r, w in _located(manifest_path, manifest, "outputs") if _covers(w, r, p)]
            if not covering:
                raise ManifestError(f"{p}: lies in the folder of stage {manifest['stage']!r} but its manifest "
                                    f"{manifest_path} does not list it")
            same = [r for r, w in covering if w == p]
            if same and same[0]["sha256"] != rec["sha256"]:
                raise ManifestError(f"{p}: sha256 {rec['sha256']} differs from {same[0]['sha256']} recorded by "
                                    f"{manifest_path}; it changed after stage {manifest['stage']!r} wrote it")
        key = record(manifest_path)
        links[key] = {"stage": str(manifest["stage"]), "manifest": key, "digest": str(manifest["digest"])}
    return [links[k] for k in sorted(links)]


def _named_stage_folder(folder: Path) -> bool:
    """A stage folder as a run lays them out: ``<stage>/manifest.json`` recording stage ``<stage>``."""
    try:
        return (folder / MANIFEST_NAME).is_file() and load_manifest(folder / MANIFEST_NAME)["stage"] == folder.name
    except ManifestError:
        return False


def nested_runs(base: Path) -> list[Path]:
    """Folders below the results folder ``base`` that are other runs' results folders (``results/<name>``,
    the README's way to keep a second config's run): one holding ``.run/``, or, without a manifest of
    its own, a stage folder named after its stage. Their stages are another run's, so ``base``'s
    root digest, ``verify`` and ``diff`` leave them out (stage folders and snapshots are not searched)."""
    if not base.is_dir() or (base / MANIFEST_NAME).exists():
        return []
    found = []
    for dirpath, dirs, files in os.walk(base):
        here = Path(dirpath)
        if here != base and MANIFEST_NAME not in files and (
                (here / RUN_STATE).is_dir() and not (here / RUN_STATE).is_symlink()
                or any(_named_stage_folder(here / d) for d in sorted(dirs) if not (here / d).is_symlink())):
            found.append(here)
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d != RUN_STATE and not d.endswith(SNAPSHOT_SUFFIX)
                         and not (here / d).is_symlink() and not (here / d / MANIFEST_NAME).exists())
    return found


def root_digest(manifests: Iterable[Path], base: Path) -> str:
    """The run's root digest: SHA-256 over every manifest's path below ``base`` and its recorded
    ``digest``, in path order (a run's stage folders sorted). Each manifest digest covers its
    outputs' bytes and its upstream manifests' digests, so this one value commits to every output
    of the run; timestamps are out of it, so a byte-identical rerun has the same root digest.
    Meaningful only for a run that verifies; ``audit.find_manifests`` gives the run's own manifests
    (not those of a run nested in its folder, ``nested_runs``)."""
    base = _abs(base)
    listing = {}
    for path in manifests:
        p = _abs(path)
        rel = p.relative_to(base).as_posix() if base in p.parents else p.name
        listing[rel] = load_manifest(p)["digest"]
    return listing_digest(listing)

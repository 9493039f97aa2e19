"""Re-verify recorded runs and explain how two runs differ, without rerunning anything.

``verify`` re-hashes every file each manifest names, checks each manifest's own digest, the
upstream manifests it recorded (the chain), undeclared files in its stage folder and the protocol
it recorded, and prints the run's root digest; ``diff`` compares two runs field by field, per stage,
and leads with a summary that names, per stage, the recorded causes (config keys, params, protocol
files it reads, its own code, libraries, inputs) that accompany a change in outputs.

Both read the folder the reviewer names as the folder it is (``os.path.realpath``), so a relative
path, an absolute one and one through a symbolic link give the same answer; stages of another run
kept inside the folder (``results/<name>``: ``chain.nested_runs``) are that run's, not this one's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .. import protocol, strict_yaml
from ..protocol.chain import read_amendments
from ..errors import Int8AlibiError, ManifestError
from ..printable import json_text, printable
from .chain import RUN_STATE, check_record, missing_links, nested_runs, root_digest, upstream_links
from ..files.hashing import canonical_json, listing_digest, open_regular, sha256_bytes, sha256_file, tree_hashes
from .manifest_format import (MANIFEST_NAME, TIMESTAMP_KEYS, inferred_root, load_manifest, manifest_digest,
                              resolve_recorded)
from ..files.parquet import content_digest, read_arrow
from ..files.transaction import SUFFIX as SNAPSHOT_SUFFIX

ERROR, NOTICE = "error", "notice"
ABSENT = "(absent)"
RESULTS = "<results>"
RUN_CONFIG = "run_config"  # diff's section for the keys of the run config a stage read (not a manifest key)
SECTIONS = ("outputs", "inputs", RUN_CONFIG, "upstream", "params", "protocol", "code", "environment", "arms",
            "exploratory", "extra", "stage", "stage_dir", "format")
SHOWN_CAUSES = 8  # the summary names this many causes of a stage, then counts the rest
# The summary names causes in this order of their first words: what a person changed (config, params,
# protocol, code, libraries) before what follows from it (inputs, upstream manifests).
CAUSE_ORDER = ("config key", "run config", "param", "protocol", "pinned data", "its code", "library", "environment",
               "arms", "exploratory", "extra", "input", "upstream")


@dataclass(frozen=True)
class Finding:
    """One verification result: ``error`` means the run no longer verifies, ``notice`` informs."""

    level: str
    manifest: str
    subject: str
    reason: str

    def text(self) -> str:
        """One line: names with control characters or undecodable bytes are escaped, so no file name
        can print a line that looks like a verdict of its own."""
        return printable(f"{self.level}: {self.manifest}: {self.subject}: {self.reason}")


@dataclass(frozen=True)
class Difference:
    """One field that differs between two runs of a stage (``ABSENT`` where one run lacks it)."""

    stage: str
    field: str
    a: Any
    b: Any

    def text(self) -> str:
        return printable(f"{self.field}: {_show(self.a)} -> {_show(self.b)}")


def _show(value: Any) -> str:
    return value if value == ABSENT else canonical_json(value)


def _real(path: str | os.PathLike[str]) -> Path:
    """The file or folder itself, however it was spelled (relative, with '..', through a link)."""
    return Path(os.path.realpath(path))


def _walk(base: Path, skip: Collection[Path]) -> Iterator[tuple[Path, list[str], list[str]]]:
    """``os.walk`` of ``base`` in name order, not following links and not entering ``skip``."""
    for dirpath, dirs, files in os.walk(base):
        here = Path(dirpath)
        dirs[:] = sorted(d for d in dirs if here / d not in skip)
        yield here, dirs, sorted(files)


def _skipped(base: Path, exclude: Iterable[str | os.PathLike[str]]) -> frozenset[Path]:
    """Folders below ``base`` that are not its run's: other runs nested in it, and ``exclude``."""
    return frozenset({*(_real(p) for p in nested_runs(base)), *(_real(p) for p in exclude)})


def _manifests_below(base: Path, skip: Collection[Path]) -> list[Path]:
    """Every manifest.json in the folder ``base``, not in a snapshot nor below a folder in ``skip``."""
    out = []
    for here, dirs, files in _walk(base, skip):
        dirs[:] = [d for d in dirs if not d.endswith(SNAPSHOT_SUFFIX)]
        if MANIFEST_NAME in files or MANIFEST_NAME in dirs:
            out.append(here / MANIFEST_NAME)
    return sorted(out)


def find_manifests(path: Path, exclude: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """``path`` itself if it is a manifest, else every manifest.json below it, in path order: not those
    inside a killed run's snapshot of its previous outputs (``leftover_snapshots`` reports those), of
    another run nested in the folder (``chain.nested_runs``), or below a folder in ``exclude`` (the
    stage folder of the stage that asks, while it runs)."""
    path = _real(path)
    if path.is_file():
        return [path]
    return _manifests_below(path, _skipped(path, exclude))


def leftover_snapshots(base: Path, skip: Collection[Path] = frozenset()) -> list[Finding]:
    """Snapshots of a stage folder's previous outputs that a killed run left (``files.transaction``)."""
    if not base.is_dir():
        return []
    return [Finding(ERROR, (here / d).as_posix(), "results folder", "the previous outputs of a stage folder, set "
                    "aside by a run of that stage that was killed; run the stage again (it puts them back first)")
            for here, dirs, _ in _walk(base, skip) for d in dirs
            if d.endswith(SNAPSHOT_SUFFIX) and not (here / d).is_symlink()]


# ----------------------------------------------------------------------------- verify


def _check_file(rec: Mapping[str, Any], path: Path) -> list[str]:
    """Reasons why the file or folder at ``path`` no longer matches its record (empty: matches);
    a changed Parquet file says whether its table content changed or it was only re-encoded."""
    try:
        reasons = check_record(rec, path)
    except Int8AlibiError as exc:  # e.g. a FIFO inside a recorded folder
        return [str(exc)]
    if not reasons or "content_digest" not in rec or path.is_symlink() or not path.is_file():
        return reasons
    try:
        table = read_arrow(path)
    except Int8AlibiError:
        return [f"{reasons[0]}; no longer a readable Parquet file"]
    if content_digest(table) == rec["content_digest"]:
        return [f"{reasons[0]}; table content identical (re-encoded only)"]
    return [f"{reasons[0]}; table content changed (rows {rec.get('rows')} -> {table.num_rows})"]


def _stray(path: Path, located: Mapping[str, list[tuple[dict[str, Any], Path]]]) -> list[str]:
    """Files in the stage folder that the manifest does not declare, symbolic links, and outputs
    recorded outside the folder. A sub-folder with its own manifest is another stage (a shard)."""
    folder = Path(os.path.abspath(path)).parent
    reasons = [f"output {rec['path']} is recorded outside the stage folder {folder}"
               for rec, where in located["outputs"] if folder not in where.parents]
    declared = {Path(os.path.abspath(path))}
    for rec, where in located["outputs"] + located["inputs"]:
        declared.add(where)
        declared.update(where / rel for rel in rec.get("files", {}) if rec.get("kind") == "dir")
    for dirpath, dirs, files in os.walk(folder):
        here = Path(dirpath)
        for name in sorted(dirs):
            if (here / name).is_symlink():
                reasons.append(f"{(here / name).relative_to(folder)}: a symbolic link in the stage folder")
        dirs[:] = sorted(d for d in dirs if not (here / d).is_symlink() and not (here / d / MANIFEST_NAME).exists())
        for name in sorted(files):
            file = here / name
            if file.is_symlink():
                reasons.append(f"{file.relative_to(folder)}: a symbolic link in the stage folder")
            elif file not in declared:
                reasons.append(f"{file.relative_to(folder)}: undeclared file in the stage folder (the manifest "
                               "lists it neither as an output nor as an input)")
    return reasons


def links_outside_stage_folders(base: Path, skip: Collection[Path] = frozenset()) -> list[Finding]:
    """Symbolic links in the results folder outside any stage folder (inside one, ``_stray`` reports
    them): a stage folder replaced by a link to a copy elsewhere would otherwise go unverified, since
    manifests are found without following links. The folder named itself is followed (``_real``)."""
    if not base.is_dir() or (base / MANIFEST_NAME).exists():
        return []
    out = []
    for here, dirs, files in _walk(base, skip):
        for name in sorted(dirs + files):
            if (here / name).is_symlink():
                out.append(Finding(ERROR, (here / name).as_posix(), "results folder",
                                   f"a symbolic link (to {os.readlink(here / name)}): a stage folder or file "
                                   "replaced by a link is not part of the run; a run holds plain folders and files"))
        dirs[:] = [d for d in dirs if not (here / d).is_symlink() and not (here / d / MANIFEST_NAME).exists()]
    return out


@dataclass(frozen=True)
class _ProtocolState:
    """The protocol as it stands in one project root: checked once, used by every manifest there."""

    module: Any
    current: Mapping[str, Any] | None  # current_pins(root); None when it could not be obtained
    why_not: str  # why ``current`` is None
    chain: tuple[Finding, ...]  # the gate's verdict on the amendment chain
    records: Mapping[str, Mapping[str, Any]] | None = None  # amendment id -> its record now (None: unknown)


def _amendment_records(root: Path) -> Mapping[str, Mapping[str, Any]] | None:
    """Every amendment record as the checkout holds it now, by id; None when they cannot be read."""
    try:
        return {a.id: a.data for a in read_amendments(root)}
    except Int8AlibiError:
        return None


def _protocol_state(root: Path) -> _ProtocolState:
    where = root.as_posix()
    chain: list[Finding] = []
    try:
        history = getattr(protocol.gate(root), "history", None)
        if getattr(history, "status", "verified") != "verified":  # e.g. no git: said, not passed
            chain.append(Finding(NOTICE, where, "amendment history", str(getattr(history, "detail", history))))
    except Int8AlibiError as exc:
        chain.append(Finding(ERROR, where, "amendment chain", str(exc)))
    except OSError as exc:  # e.g. the project root is not a folder git can run in
        chain.append(Finding(ERROR, where, "amendment chain", f"chain check not possible: {exc}"))
    try:
        return _ProtocolState(protocol, protocol.current_pins(root), "", tuple(chain), _amendment_records(root))
    except (Int8AlibiError, OSError) as exc:
        return _ProtocolState(protocol, None, f"the protocol in force cannot be read ({exc})", tuple(chain))


def _stage_reads(protocol: Any, stage: str, protocol_root: str) -> set[str] | None:
    """Protocol files the stage reads, without the protocol-root prefix; None when unknown."""
    stage_files = getattr(protocol, "STAGE_FILES", None) if protocol is not None else None
    if not isinstance(stage_files, Mapping) or stage not in stage_files:
        return None
    return {_strip_root(f, protocol_root) for f in stage_files[stage]}


def _strip_root(rel: str, protocol_root: str) -> str:
    return rel.removeprefix(f"{protocol_root.rstrip('/')}/")


def _check_protocol(manifest: Mapping[str, Any], where: str, root: Path, state: _ProtocolState,
                    given_root: bool = True) -> list[Finding]:
    """Recorded protocol files must still hash to their pins; a later amendment is reported."""
    recorded = manifest["protocol"]
    proot = recorded.get("root", "preregistration")
    pins = recorded.get("pins", {})
    reads = _stage_reads(state.module, manifest["stage"], proot)
    scope = "read by this stage" if reads is not None else "stage's protocol files unknown, so all count"
    out: list[Finding] = []
    for rel, sha in sorted(pins.get("files", {}).items()):
        level = ERROR if reads is None or _strip_root(rel, proot) in reads else NOTICE
        path = root / rel if (root / rel).exists() else root / proot / rel
        subject = f"protocol file {rel}"
        if not path.is_file():
            hint = ("" if given_root or (root / proot).is_dir() else
                    f"; no {proot}/ under {root}: if this run is a copy outside its checkout, pass --project-root "
                    "CHECKOUT")
            out.append(Finding(level, where, subject, (f"missing ({scope})" if level == ERROR else
                               "missing (not read by this stage)") + hint))
        elif (now := sha256_file(path)) != sha:
            out.append(Finding(level, where, subject, f"changed since this stage ran (recorded {sha}, now {now}; "
                               + (scope if level == ERROR else "not read by this stage") + ")"))
    current = state.current
    if current is None:
        out.append(Finding(ERROR, where, "protocol", f"protocol check not possible: {state.why_not}"))
        return out
    out.extend(_rewritten(pins, current, where, state))
    if current.get("amendment") != pins.get("amendment"):
        out.append(Finding(NOTICE, where, "protocol", f"amended since this stage ran "
                           f"({pins.get('amendment')} -> {current.get('amendment')})"))
    for key in sorted(set(pins.get("data", {})) | set(current.get("data", {}))):
        then, now = pins.get("data", {}).get(key, ABSENT), current.get("data", {}).get(key, ABSENT)
        if then != now:
            out.append(Finding(NOTICE, where, f"pinned data {key}", f"pin changed since this stage ran "
                               f"({_show(then)} -> {_show(now)})"))
    return out


def _rewritten(pins: Mapping[str, Any], current: Mapping[str, Any], where: str,
               state: _ProtocolState) -> list[Finding]:
    """The amendment history rewritten since the stage ran (after the lock): the amendment it ran under
    now pins other files or data, or is gone, or the lock commit is another commit. The gate alone
    cannot see a rewrite that recomputed the whole chain; the manifests recorded before it can."""
    history = pins.get("history")
    recorded_history = history if isinstance(history, Mapping) else {}
    if recorded_history.get("status") not in ("verified", "partial") or state.records is None:
        return []  # recorded before the lock (drafts may change) or amendments unreadable (reported elsewhere)
    out = []
    then, now_lock = recorded_history.get("lock_commit"), (current.get("history") or {}).get("lock_commit")
    if then and now_lock and then != now_lock:
        out.append(Finding(ERROR, where, "amendment history", f"the lock commit is now {now_lock}, but this stage "
                           f"ran under lock commit {then}: the history was rewritten after the lock"))
    ran_under = pins.get("amendment")
    record = state.records.get(str(ran_under))
    if record is None:
        out.append(Finding(ERROR, where, "amendment history", f"{ran_under}, which this stage ran under, is no "
                           "longer in amendments/: the history was rewritten"))
    elif dict(record.get("pins") or {}) != dict(pins.get("files") or {}) or \
            dict(record.get("data_pins") or {}) != dict(pins.get("data") or {}):
        out.append(Finding(ERROR, where, "amendment history", f"{ran_under} now pins other protocol files or data "
                           "than when this stage ran under it: the amendment was rewritten"))
    return out


def _verify_manifest(path: Path, manifest: Mapping[str, Any], project_root: Path | None,
                     state: _ProtocolState) -> list[Finding]:
    where = path.as_posix()
    out: list[Finding] = []
    digest = manifest_digest(manifest)
    if digest != manifest["digest"]:
        out.append(Finding(ERROR, where, "manifest", f"digest mismatch (recorded {manifest['digest']}, "
                           f"computed {digest}): the manifest was edited after it was written"))
    stage_dir = manifest["stage_dir"]
    located: dict[str, list[tuple[dict[str, Any], Path]]] = {}
    for role in ("outputs", "inputs"):
        located[role] = []
        for rec in manifest[role]:
            if ".." in PurePosixPath(rec["path"]).parts:
                out.append(Finding(ERROR, where, f"{role[:-1]} {rec['path']}", "recorded path contains '..'"))
                continue
            where_now = resolve_recorded(rec["path"], path, stage_dir, project_root)
            located[role].append((dict(rec), Path(os.path.abspath(where_now))))
            for reason in _check_file(rec, where_now):
                out.append(Finding(ERROR, where, f"{role[:-1]} {rec['path']}", reason))
    out.extend(Finding(ERROR, where, "stage folder", reason) for reason in _stray(path, located))
    out.extend(Finding(ERROR, where, "upstream", reason) for reason in upstream_links(path, manifest))
    out.extend(Finding(ERROR, where, "upstream", reason) for reason in missing_links(path, manifest, located["inputs"]))
    out.extend(_check_protocol(manifest, where, project_root or inferred_root(path, stage_dir), state,
                               given_root=project_root is not None))
    return out


def audit_run(results_dir: str | os.PathLike[str], project_root: str | os.PathLike[str] | None = None,
              exclude: Iterable[str | os.PathLike[str]] = ()) -> tuple[list[Finding], list[Path], str | None]:
    """``verify``'s findings, the manifests it verified and the run's root digest over them (None while
    any finding is an error). ``exclude``: folders below ``results_dir`` that are not verified (the
    crossmodel view leaves out its own folder while it writes it); runs nested in the folder are
    left out with a notice each."""
    base = _real(results_dir)
    given_root = _real(project_root) if project_root is not None else None
    if not base.exists():
        return [Finding(ERROR, base.as_posix(), "results", "does not exist")], [], None
    nested = nested_runs(base)
    skip = frozenset({*nested, *(_real(p) for p in exclude)})
    manifests = [base] if base.is_file() else _manifests_below(base, skip)
    findings: list[Finding] = links_outside_stage_folders(base, skip) + leftover_snapshots(base, skip)
    findings += [Finding(NOTICE, run.as_posix(), "results folder", "another run's results folder (it holds .run/ "
                         "or stage folders of its own): not part of this run nor of its root digest; verify it "
                         "on its own") for run in nested]
    if not manifests:
        return [*findings, Finding(ERROR, base.as_posix(), "results", f"no {MANIFEST_NAME} found")], [], None
    states: dict[Path, _ProtocolState] = {}
    for path in manifests:
        try:
            manifest = load_manifest(path)
        except ManifestError as exc:
            findings.append(Finding(ERROR, path.as_posix(), "manifest", str(exc)))
            continue
        try:
            root = (given_root or inferred_root(path, manifest["stage_dir"])).resolve()
            if root not in states:
                states[root] = _protocol_state(root)
            findings.extend(_verify_manifest(path, manifest, given_root, states[root]))
        except Int8AlibiError as exc:  # a manifest whose recorded places cannot be followed
            findings.append(Finding(ERROR, path.as_posix(), "manifest", str(exc)))
    for state in states.values():
        findings.extend(state.chain)
    clean = not any(f.level == ERROR for f in findings)
    return findings, manifests, root_digest(manifests, base if base.is_dir() else base.parent) if clean else None


def verify(results_dir: str | os.PathLike[str], project_root: str | os.PathLike[str] | None = None) -> list[Finding]:
    """Every problem with every manifest of the run in ``results_dir`` (empty list: everything verifies).

    The project root (for inputs and protocol files) is inferred from each manifest's location
    unless given. The amendment chain is checked once per project root with
    ``int8alibi.protocol.gate``; when that module is missing the findings say so.
    """
    return audit_run(results_dir, project_root)[0]


def verify_main(argv: list[str] | None = None) -> int:
    """``int8alibi verify``: 0 when everything verifies, 1 when anything does not."""
    parser = argparse.ArgumentParser(
        prog="int8alibi verify",
        description="Re-hash every output and input named by the manifests under RESULTS, check each "
                    "manifest's digest, its upstream manifests, undeclared files, the protocol files it "
                    "pinned and the amendment chain; print the run's root digest.")
    parser.add_argument("results", nargs="?", default="results", type=Path,
                        help="a results folder, a stage folder or one manifest.json (default: results); runs "
                             "kept in sub-folders of it (results/<name>) are verified on their own")
    parser.add_argument("--project-root", type=Path, default=None,
                        help="project checkout holding preregistration/ (default: inferred per manifest)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--expect-root", metavar="SHA256", default=None,
                        help="the published root digest: anything else is an error")
    args = parser.parse_args(argv)
    if args.project_root is not None and not args.project_root.is_dir():
        print(printable(f"int8alibi verify: --project-root {args.project_root}: not a folder (the project "
                        "checkout holding preregistration/)"), file=sys.stderr)
        return 1
    findings, manifests, root = audit_run(args.results, args.project_root)
    if args.expect_root is not None and root != args.expect_root.strip().lower():
        real = _real(args.results)
        findings.append(Finding(ERROR, (real if real.is_dir() else real.parent).as_posix(), "root digest",
                                f"{root or 'none (the run does not verify)'} is not the expected "
                                f"{args.expect_root}"))
    errors = sum(f.level == ERROR for f in findings)
    if args.json:
        report = {"manifests": [m.as_posix() for m in manifests], "errors": errors, "root_digest": root,
                  "findings": [asdict(f) for f in findings]}
        print(json_text(json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False)))
    else:
        for finding in findings:
            print(finding.text())
        print(f"verified {len(manifests)} manifest(s): {errors} error(s), {len(findings) - errors} notice(s)")
        print(f"root digest: {root}" if root else "root digest: none (the run does not verify)")
    return 1 if errors else 0


# ----------------------------------------------------------------------------- diff


def _key(name: str) -> str:
    return f".{name}" if name.isidentifier() else f"[{name}]"


def _flatten(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """Leaf fields of a manifest; output/input lists are keyed by path and arms by name."""
    if isinstance(value, Mapping) and value:
        for name in sorted(value):
            yield from _flatten(value[name], f"{prefix}{_key(str(name))}")
    elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        label = next((k for k in ("path", "name", "manifest") if all(k in v for v in value)
                      and len({str(v[k]) for v in value}) == len(value)), None)
        for i, item in enumerate(value):
            tag = str(item[label]) if label else str(i)
            rest = {k: v for k, v in item.items() if k != label}
            yield from _flatten(rest, f"{prefix}[{tag}]")
    else:
        yield prefix, value


def _portable(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest with paths under its results folder written ``<results>/...``, so runs kept in
    differently named results folders compare file by file."""
    stage = PurePosixPath(manifest["stage_dir"])
    if stage.is_absolute() or len(stage.parts) < 2:
        return dict(manifest)
    results = stage.parent

    def portable(path: str) -> str:
        rec = PurePosixPath(path)
        if not rec.is_relative_to(results):
            return path
        return (PurePosixPath(RESULTS) / rec.relative_to(results)).as_posix()

    out = dict(manifest)
    out["stage_dir"] = portable(manifest["stage_dir"])
    for role in ("outputs", "inputs"):
        out[role] = [{**rec, "path": portable(rec["path"])} for rec in manifest[role]]
    out["upstream"] = [{**link, "manifest": portable(link["manifest"])} for link in manifest.get("upstream", [])]
    return out


def _rehashed(path: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest with each output record's digest (and size; for Parquet, rows and content
    digest) replaced by what the file holds now, so ``diff`` compares bytes, not what the manifests
    claim; a record whose file no longer matches it gains ``changed_since_recorded``. Inputs stay as
    recorded: those outside the results folder (protocol files, model sources) are the checkout's
    files now, not what an earlier run read, and those inside it are another stage's outputs."""
    out = dict(manifest)
    for role in ("outputs",):
        records = []
        for rec in manifest[role]:
            new = dict(rec)
            where = resolve_recorded(rec["path"], path, manifest["stage_dir"])
            if ".." in PurePosixPath(rec["path"]).parts or where.is_symlink():
                new.update(sha256="(not re-hashed: path with '..' or a symbolic link)", bytes=ABSENT)
            elif rec.get("kind") == "dir":
                files = tree_hashes(where) if where.is_dir() else {}
                new.update(sha256=listing_digest(files) if where.is_dir() else ABSENT, files=files)
            elif where.is_file():
                new.update(sha256=sha256_file(where), bytes=where.stat().st_size)
                if "content_digest" in rec and new["sha256"] != rec["sha256"]:
                    try:
                        table = read_arrow(where)
                        new.update(rows=table.num_rows, content_digest=content_digest(table))
                    except Int8AlibiError:
                        new.update(rows=ABSENT, content_digest="(not a readable Parquet file)")
            else:
                new.update(sha256=ABSENT, bytes=ABSENT)
            if new["sha256"] != rec["sha256"]:
                new["changed_since_recorded"] = True
            records.append(new)
        out[role] = records
    return out


def _read_run_config(where: Path, sha256: str) -> Any:
    """The run config at ``where``, parsed, when it is the file recorded with ``sha256``; else a
    ``ManifestError`` whose words do not depend on where the run lies (so two runs compare)."""
    try:
        with open_regular(where, ManifestError) as handle:
            data = handle.read(strict_yaml.MAX_BYTES + 1)
    except (ManifestError, OSError) as exc:
        raise ManifestError("missing or not a regular file") from exc
    if sha256_bytes(data) != sha256:
        raise ManifestError("not the file the stage read: changed after it ran (run int8alibi verify)")
    try:
        return strict_yaml.parse(data.decode("utf-8"), where.as_posix(), ManifestError)
    except (ManifestError, UnicodeDecodeError) as exc:
        raise ManifestError("not readable as strict YAML") from exc


def _with_run_config(path: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest with the run config its stage read in place of that input's record: section
    ``run_config`` holds the file's keys, so ``diff`` names the config keys that changed rather than a
    ``.run/<digest>/config.yaml`` of another name; a file that is no longer the one the stage read,
    or cannot be read, is its recorded digest and why."""
    out = dict(manifest)
    records = [r for r in manifest["inputs"] if PurePosixPath(r["path"]).parts[-3:-2] == (RUN_STATE,)
               and PurePosixPath(r["path"]).name == "config.yaml"]
    if len(records) != 1 or ".." in PurePosixPath(records[0]["path"]).parts:
        return out
    rec = records[0]
    out["inputs"] = [r for r in manifest["inputs"] if r is not rec]
    try:
        out[RUN_CONFIG] = _read_run_config(resolve_recorded(rec["path"], path, manifest["stage_dir"]), rec["sha256"])
    except ManifestError as exc:
        out[RUN_CONFIG] = f"(recorded sha256 {rec['sha256']}; its keys are unknown: {exc})"
    return out


def _fields(manifest: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    manifest = _portable(manifest)
    for section in manifest:
        if section == "digest" or section in TIMESTAMP_KEYS:
            continue
        out.update(_flatten(manifest[section], section))
    return out


def _section(field: str) -> str:
    return field.split(".", 1)[0].split("[", 1)[0]


def _order(field: str) -> tuple[int, str]:
    section = _section(field)
    return (SECTIONS.index(section) if section in SECTIONS else len(SECTIONS), field)


def _load_run(run: Path, rehash: bool) -> dict[str, dict[str, Any]]:
    """Stage -> its manifest as diff compares it (re-hashed outputs, the run config's keys), for the run
    in ``run`` (its own stages: not those of a run nested in its folder)."""
    run = _real(run)
    if not run.exists():
        raise ManifestError(f"{run}: does not exist")
    by_stage: dict[str, dict[str, Any]] = {}
    for path in find_manifests(run):
        manifest = load_manifest(path)
        key = manifest["stage"]
        if key in by_stage and run.is_dir():  # a nested stage folder of the same stage (a faults shard)
            key = f"{key} {path.parent.relative_to(run).as_posix()}"
        if key in by_stage:
            raise ManifestError(f"{path}: a second manifest for stage {manifest['stage']!r} in {run}")
        by_stage[key] = _with_run_config(path, _rehashed(path, manifest) if rehash else manifest)
    if not by_stage:
        raise ManifestError(f"{run}: no {MANIFEST_NAME} found")
    return by_stage


def _compare(run_a: str | os.PathLike[str], run_b: str | os.PathLike[str],
             rehash: bool) -> tuple[list[Difference], int]:
    """The differences and the number of stages the two runs hold together."""
    a, b = _load_run(Path(run_a), rehash), _load_run(Path(run_b), rehash)
    out: list[Difference] = []
    for stage in sorted(set(a) | set(b)):
        if stage not in a or stage not in b:
            out.append(Difference(stage, "manifest", "present" if stage in a else ABSENT,
                                  "present" if stage in b else ABSENT))
            continue
        fa, fb = _fields(a[stage]), _fields(b[stage])
        for field in sorted(set(fa) | set(fb), key=_order):
            va, vb = fa.get(field, ABSENT), fb.get(field, ABSENT)
            if canonical_json(va) != canonical_json(vb):
                out.append(Difference(stage, field, va, vb))
    return out, len(set(a) | set(b))


def diff(run_a: str | os.PathLike[str], run_b: str | os.PathLike[str], *, rehash: bool = True) -> list[Difference]:
    """Every field that differs between two runs, per stage, in a stable order.

    With ``rehash`` (the default) every output file is re-hashed, so a changed byte
    shows even where a manifest was rewritten to match; without it only recorded digests are
    compared. Timestamps and the manifests' own digests are not compared. The run config a stage
    read is compared key by key (section ``run_config``).
    """
    return _compare(run_a, run_b, rehash)[0]


@dataclass(frozen=True)
class StageChange:
    """One stage's differences in words: what its outputs did (``differ``, ``identical``, ``stale``: a
    file changed after its stage ran, or ``one run only``), the recorded differences that can change
    them (``causes``), those that cannot (``other``: the git commit, the amendment's id, a protocol
    file the stage does not read, package code outside the stage's own modules), and ``why``."""

    stage: str
    outputs: str
    causes: tuple[str, ...]
    other: tuple[str, ...]
    why: str


def _record_name(rest: str) -> str:
    """The record a field like ``[<results>/x/y.parquet].sha256`` belongs to."""
    return rest[1:].split("]", 1)[0] if rest.startswith("[") else rest.removeprefix(".").split(".", 1)[0]


def _reads(stage: str, rel: str) -> bool:
    """Whether ``stage`` reads protocol file ``rel`` (``protocol.STAGE_FILES``; unknown: it counts)."""
    reads = _stage_reads(protocol, stage, "preregistration")
    return reads is None or _strip_root(rel, "preregistration") in reads


def _cause(stage: str, d: Difference) -> tuple[bool, str] | None:
    """(whether it can change the stage's outputs, the difference in words); None for an output, and
    for a section empty in one run (the other run's entries are fields of their own)."""
    section = _section(d.field)
    rest = d.field[len(section):]
    plain = rest.removeprefix(".")
    if section == "outputs" or not rest and ABSENT in (d.a, d.b) and ({} in (d.a, d.b) or [] in (d.a, d.b)):
        return None
    if section == "inputs":
        return True, f"input {_record_name(rest)}"
    if section == "upstream":
        folder = _record_name(rest).removeprefix(f"{RESULTS}/").removesuffix(f"/{MANIFEST_NAME}")
        return True, f"upstream stage {folder}"
    if section == RUN_CONFIG:
        return True, f"config key {plain}" if plain else "run config"
    if section == "params":
        return True, f"param {plain}"
    if section == "protocol":
        if rest.startswith(".pins.files"):
            rel = _record_name(rest.removeprefix(".pins.files"))
            return (True, f"protocol file {rel}") if _reads(stage, rel) else (
                False, f"protocol file {rel} (not read by this stage)")
        if rest == ".pins.amendment":
            return False, f"amendment {d.a} -> {d.b}"
        if rest.startswith(".pins.history"):
            return False, "amendment history"
        if rest.startswith(".pins.data"):
            return True, f"pinned data {_record_name(rest.removeprefix('.pins.data'))}"
        return True, f"protocol {plain}"
    if section == "code":
        words = {".stage_digest": "its code (the stage's code digest)", ".package_digest": "package code outside "
                 "its modules", ".git.commit": "git commit", ".git.dirty": "uncommitted changes"}
        return rest == ".stage_digest", words.get(rest, f"code {plain}")
    if section == "environment":
        if rest.startswith((".libraries.", ".libraries[")):
            return True, f"library {_record_name(rest.removeprefix('.libraries'))} {d.a} -> {d.b}"
        return True, f"environment {plain}"
    if section in ("arms", "exploratory", "extra"):
        return True, {"arms": "arms", "exploratory": "exploratory flag", "extra": "extra"}[section]
    return False, f"{section}{rest}"


def _listed(items: Iterable[str]) -> str:
    """The first ``SHOWN_CAUSES`` items and a count of the rest: one summary line per stage stays short."""
    shown = list(items)
    more = len(shown) - SHOWN_CAUSES
    return ", ".join(shown[:SHOWN_CAUSES]) + (f" and {more} more" if more > 0 else "")


def _change(stage: str, diffs: list[Difference]) -> StageChange:
    """``changes`` for one stage's differences (a stale output file is named first: judge it with verify)."""
    if diffs[0].field == "manifest":
        return StageChange(stage, "one run only", (), (), "the stage ran in only one of the two runs")
    causes: dict[str, None] = {}
    other: dict[str, None] = {}
    for d in diffs:
        found = _cause(stage.split(" ", 1)[0], d)
        if found is not None:
            (causes if found[0] else other)[found[1]] = None
    causes = dict.fromkeys(sorted(causes, key=_rank))
    outputs = [d for d in diffs if _section(d.field) == "outputs"]
    stale = [d.field.rsplit(".", 1)[0] for d in diffs if d.field.endswith(".changed_since_recorded")]
    aside = f" (also differ, not causes: {_listed(other)})" if other else ""
    if stale:
        state, why = "stale", (f"{', '.join(stale)}: no longer what its manifest recorded in one run (the file "
                               "changed after the stage ran; run verify on that run)")
    elif not outputs and not causes:
        state, why = "identical", f"outputs identical; differences only in {_listed(other)}, which cannot change them"
    elif not outputs:
        state, why = "identical", f"outputs identical despite differences in {_listed(causes)}{aside}"
    elif causes:
        state, why = "differ", f"outputs differ; causes: {_listed(causes)}{aside}"
    elif all(d.field.endswith((".parquet].sha256", ".parquet].bytes")) for d in outputs):
        state, why = "differ", ("outputs differ in file bytes only (table content identical) with identical "
                                f"inputs, params, protocol, code and environment: the files were re-encoded{aside}")
    else:
        state, why = "differ", ("outputs differ with identical inputs, params, protocol, code and environment: "
                                f"the stage is not deterministic, or an output changed after the run (run verify)"
                                f"{aside}")
    return StageChange(stage, state, tuple(causes), tuple(other), why)


def _rank(words: str) -> int:
    return next((i for i, start in enumerate(CAUSE_ORDER) if words.startswith(start)), len(CAUSE_ORDER))


def changes(differences: list[Difference]) -> dict[str, StageChange]:
    """Per differing stage, in stage order, what changed and why as far as the manifests can tell:
    code counts as a cause only where the stage's own code digest differs (not the git commit, which
    an amendment's commit moves), a protocol file only where the stage reads it."""
    by_stage: dict[str, list[Difference]] = {}
    for d in differences:
        by_stage.setdefault(d.stage, []).append(d)
    return {stage: _change(stage, diffs) for stage, diffs in by_stage.items()}


def explain(differences: list[Difference]) -> dict[str, str]:
    """Per stage, why its outputs differ as far as the manifests can tell (``changes``' words)."""
    return {stage: change.why for stage, change in changes(differences).items()}


def diff_main(argv: list[str] | None = None) -> int:
    """``int8alibi diff A B``: 0 when the runs agree, 1 when they differ, 2 when one cannot be read."""
    parser = argparse.ArgumentParser(
        prog="int8alibi diff",
        description="Say which stages differ between two runs (results folders, stage folders or manifest "
                    "files) and why, in a summary first, then which outputs, inputs, run config keys, params, "
                    "protocol pins, code and environment fields differ, per stage.")
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--json", action="store_true", help="print the differences as JSON")
    parser.add_argument("--recorded-only", action="store_true",
                        help="compare the digests the manifests record without re-hashing the files "
                             "(fast, but trusts the manifests: a changed byte they do not record goes unseen)")
    args = parser.parse_args(argv)
    rehash = not args.recorded_only
    basis = ("files re-hashed" if rehash else
             "recorded digests only: files NOT re-hashed (drop --recorded-only to re-hash)")
    try:
        differences, stages = _compare(args.run_a, args.run_b, rehash)
    except Int8AlibiError as exc:
        print(printable(f"int8alibi diff: {exc}"), file=sys.stderr)
        return 2
    summary = changes(differences)
    if args.json:
        report = {"a": args.run_a.as_posix(), "b": args.run_b.as_posix(), "rehashed": rehash, "stages": stages,
                  "differences": [asdict(d) for d in differences],
                  "summary": {s: {"outputs": c.outputs, "causes": list(c.causes), "other": list(c.other)}
                              for s, c in summary.items()},
                  "why": {s: c.why for s, c in summary.items()}}
        print(json_text(json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False)))
        return 1 if differences else 0
    print(printable(f"{len(summary)} of {stages} stage(s) differ between {args.run_a} and {args.run_b} ({basis})"
                    + (":" if summary else "")))
    for change in summary.values():
        print(printable(f"  {change.stage}: {change.why}"))
    stage = None
    for d in differences:
        if d.stage != stage:
            stage = d.stage
            print(printable(f"stage {stage} ({basis})"))
        print(f"  {d.text()}")
    print(printable(f"{len(differences)} difference(s) in {len(summary)} stage(s) between {args.run_a} and "
                    f"{args.run_b} ({basis})"))
    return 1 if differences else 0

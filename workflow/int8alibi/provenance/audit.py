"""Re-verify recorded runs and explain how two runs differ, without rerunning anything.

``verify`` re-hashes every file each manifest names, checks each manifest's own digest, the
upstream manifests it recorded (the chain), undeclared files in its stage folder and the protocol
it recorded, and prints the run's root digest; ``diff`` compares two runs field by field, per stage, and says which
recorded causes (params, inputs, protocol, code, environment) accompany a change in outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .. import protocol
from ..protocol.chain import read_amendments
from ..errors import Int8AlibiError, ManifestError
from ..printable import json_text, printable
from .chain import check_record, missing_links, root_digest, upstream_links
from .hashing import canonical_json, listing_digest, sha256_file, tree_hashes
from .manifest_format import (MANIFEST_NAME, TIMESTAMP_KEYS, inferred_root, load_manifest, manifest_digest,
                              resolve_recorded)
from .parquet import content_digest, read_arrow
from .transaction import SUFFIX as SNAPSHOT_SUFFIX

ERROR, NOTICE = "error", "notice"
ABSENT = "(absent)"
RESULTS = "<results>"
SECTIONS = ("outputs", "inputs", "upstream", "params", "protocol", "code", "environment", "arms", "exploratory",
            "extra", "stage", "stage_dir", "format")
CAUSES = ("inputs", "upstream", "params", "protocol", "code", "environment", "arms", "exploratory", "extra")


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


def find_manifests(path: Path) -> list[Path]:
    """``path`` itself if it is a manifest, else every manifest.json below it, in path order (not those
    inside a killed run's snapshot of its previous outputs: ``leftover_snapshots`` reports those)."""
    if path.is_file():
        return [path]
    return sorted(m for m in path.rglob(MANIFEST_NAME)
                  if not any(part.endswith(SNAPSHOT_SUFFIX) for part in m.relative_to(path).parts[:-1]))


def leftover_snapshots(base: Path) -> list[Finding]:
    """Snapshots of a stage folder's previous outputs that a killed run left (``provenance.transaction``)."""
    if not base.is_dir():
        return []
    return [Finding(ERROR, snap.as_posix(), "results folder", "the previous outputs of a stage folder, set aside by a "
                    "run of that stage that was killed; run the stage again (it puts them back first)")
            for snap in sorted(base.rglob(f"*{SNAPSHOT_SUFFIX}")) if snap.is_dir() and not snap.is_symlink()]


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
    folder = path.absolute().parent
    reasons = [f"output {rec['path']} is recorded outside the stage folder {folder}"
               for rec, where in located["outputs"] if folder not in where.parents]
    declared = {path.absolute()}
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


def links_outside_stage_folders(base: Path) -> list[Finding]:
    """Symbolic links in the results folder outside any stage folder (inside one, ``_stray`` reports
    them): a stage folder replaced by a link to a copy elsewhere would otherwise go unverified, since
    manifests are found without following links."""
    if base.is_symlink():
        return [Finding(ERROR, base.as_posix(), "results", f"a symbolic link (to {os.readlink(base)}); "
                        "verify the folder it points to, not the link")]
    if not base.is_dir() or (base / MANIFEST_NAME).exists():
        return []
    out = []
    for dirpath, dirs, files in os.walk(base):
        here = Path(dirpath)
        for name in sorted(dirs + files):
            if (here / name).is_symlink():
                out.append(Finding(ERROR, (here / name).as_posix(), "results folder",
                                   f"a symbolic link (to {os.readlink(here / name)}): a stage folder or file "
                                   "replaced by a link is not part of the run; a run holds plain folders and files"))
        dirs[:] = sorted(d for d in dirs if not (here / d).is_symlink() and not (here / d / MANIFEST_NAME).exists())
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


def verify(results_dir: str | Path, project_root: str | Path | None = None) -> list[Finding]:
    """Every problem with every manifest under ``results_dir`` (empty list: everything verifies).

    The project root (for inputs and protocol files) is inferred from each manifest's location
    unless given. The amendment chain is checked once per project root with
    ``int8alibi.protocol.gate``; when that module is missing the findings say so.
    """
    base = Path(results_dir)
    given_root = Path(project_root) if project_root is not None else None
    if not base.exists():
        return [Finding(ERROR, str(base), "results", "does not exist")]
    manifests = find_manifests(base)
    findings: list[Finding] = links_outside_stage_folders(base) + leftover_snapshots(base)
    if not manifests:
        return [*findings, Finding(ERROR, str(base), "results", f"no {MANIFEST_NAME} found")]
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
    return findings


def verify_main(argv: list[str] | None = None) -> int:
    """``int8alibi verify``: 0 when everything verifies, 1 when anything does not."""
    parser = argparse.ArgumentParser(
        prog="int8alibi verify",
        description="Re-hash every output and input named by the manifests under RESULTS, check each "
                    "manifest's digest, its upstream manifests, undeclared files, the protocol files it "
                    "pinned and the amendment chain; print the run's root digest.")
    parser.add_argument("results", nargs="?", default="results", type=Path,
                        help="a results folder, a stage folder or one manifest.json (default: results)")
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
    findings = verify(args.results, args.project_root)
    manifests = find_manifests(args.results) if args.results.exists() else []
    base = args.results if args.results.is_dir() else args.results.parent
    clean = manifests and not any(f.level == ERROR for f in findings)
    root = root_digest(manifests, base) if clean else None
    if args.expect_root is not None and root != args.expect_root.strip().lower():
        findings.append(Finding(ERROR, base.as_posix(), "root digest",
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
        by_stage[key] = _rehashed(path, manifest) if rehash else manifest
    if not by_stage:
        raise ManifestError(f"{run}: no {MANIFEST_NAME} found")
    return by_stage


def diff(run_a: str | Path, run_b: str | Path, *, rehash: bool = True) -> list[Difference]:
    """Every field that differs between two runs, per stage, in a stable order.

    With ``rehash`` (the default) every output file is re-hashed, so a changed byte
    shows even where a manifest was rewritten to match; without it only recorded digests are
    compared. Timestamps and the manifests' own digests are not compared.
    """
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
    return out


def explain(differences: list[Difference]) -> dict[str, str]:
    """Per stage, why its outputs differ as far as the manifests can tell."""
    by_stage: dict[str, list[Difference]] = {}
    for d in differences:
        by_stage.setdefault(d.stage, []).append(d)
    out: dict[str, str] = {}
    for stage, diffs in by_stage.items():
        if diffs[0].field == "manifest":
            out[stage] = "the stage ran in only one of the two runs"
            continue
        sections = {_section(d.field) for d in diffs}
        causes = [c for c in CAUSES if c in sections]
        outputs = [d for d in diffs if _section(d.field) == "outputs"]
        stale = [d.field.rsplit(".", 1)[0] for d in diffs if d.field.endswith(".changed_since_recorded")]
        if stale:
            out[stage] = (f"{', '.join(stale)}: no longer what its manifest recorded in one run (the file "
                          "changed after the stage ran; run verify on that run)")
        elif not outputs:
            out[stage] = f"outputs identical despite differences in {', '.join(causes)}"
        elif causes:
            out[stage] = f"outputs differ; recorded causes: {', '.join(causes)}"
        elif all(d.field.endswith((".parquet].sha256", ".parquet].bytes")) for d in outputs):
            out[stage] = ("outputs differ in file bytes only (table content identical) with identical "
                          "inputs, params, protocol, code and environment: the files were re-encoded")
        else:
            out[stage] = ("outputs differ with identical inputs, params, protocol, code and environment: "
                          "the stage is not deterministic, or an output changed after the run (run verify)")
    return out


def diff_main(argv: list[str] | None = None) -> int:
    """``int8alibi diff A B``: 0 when the runs agree, 1 when they differ, 2 when one cannot be read."""
    parser = argparse.ArgumentParser(
        prog="int8alibi diff",
        description="Say which outputs, inputs, params, protocol pins, code and environment fields differ "
                    "between two runs (results folders, stage folders or manifest files), per stage.")
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
        differences = diff(args.run_a, args.run_b, rehash=rehash)
    except Int8AlibiError as exc:
        print(printable(f"int8alibi diff: {exc}"), file=sys.stderr)
        return 2
    why = explain(differences)
    if args.json:
        report = {"a": args.run_a.as_posix(), "b": args.run_b.as_posix(), "rehashed": rehash,
                  "differences": [asdict(d) for d in differences], "why": why}
        print(json_text(json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False)))
    else:
        stage = None
        for d in differences:
            if d.stage != stage:
                if stage is not None:
                    print(f"  why: {why[stage]}")
                stage = d.stage
                print(f"stage {stage} ({basis})")
            print(f"  {d.text()}")
        if stage is not None:
            print(f"  why: {why[stage]}")
        print(f"{len(differences)} difference(s) in {len(why)} stage(s) between {args.run_a} and {args.run_b} "
              f"({basis})")
    return 1 if differences else 0

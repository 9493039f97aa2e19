"""Append an amendment: the only way to change the protocol or pin a data artifact.

The new record links to the previous amendment file by hash and pins every protocol file as it
is now. Data pins carry over from the previous amendment unless re-pinned, so the latest record
alone states the whole protocol in force. The stages a change touches must be declared: a stage
that reads a changed file (STAGE_FILES) and is not listed is an error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..errors import Int8AlibiError, ProtocolError
from ..printable import printable
from ..protocol.chain import Amendment, amendment_name, read_amendments, verify_chain
from ..protocol.gate import gate, refuse_protocol_links
from ..protocol.history import check_dates, check_history
from ..protocol.load import load
from ..protocol.pins import AMENDMENTS_DIR, PROTOCOL_DIR, STAGE_FILES, data_digest, protocol_files_on_disk, stage_reads
from ..protocol.schema import parse_yaml, validate
from ..provenance.environment import made_in

STATUSES = ("pre-data", "post-data")


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line text as literal blocks, keys in the order given."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _affected_stages(changed: Iterable[str]) -> dict[str, str]:
    """Stage -> the first changed protocol file it reads (the protocol stage reads them all)."""
    needed: dict[str, str] = {}
    for rel in sorted(changed):
        for stage in STAGE_FILES:
            if rel in stage_reads(stage) or stage == "protocol":
                needed.setdefault(stage, rel)
    return needed


def _resolve(root: Path, name: str, path: str | Path) -> Path:
    """The file a data pin names (symbolic links resolved): inside the project, or an output a stage's
    manifest lists and still vouches for (a results folder under ``results_root``); else refused."""
    given = Path(path) if Path(path).is_absolute() else root / path
    target = given.resolve()
    from ..provenance.chain import verify_input  # reads manifests (pyarrow): not imported when a run is planned

    if not target.is_relative_to(root.resolve()) and not verify_input(target):
        raise ProtocolError(f"--pin {name}={path}: {target} lies outside the project {root.resolve()} and no stage "
                            "manifest lists it; only the project's own artifacts are pinned")
    return target


def _check_arguments(summary: str, rationale: str, stages: Sequence[str], status: str) -> None:
    if status not in STATUSES:
        raise ProtocolError(f"amend: status {status!r} must be one of {list(STATUSES)}")
    unknown = sorted(set(stages) - set(STAGE_FILES))
    if not stages or unknown:
        raise ProtocolError(f"amend: stages {list(stages)} must be a non-empty subset of {sorted(STAGE_FILES)}")
    if not summary.strip() or not rationale.strip():
        raise ProtocolError("amend: summary and rationale must both say something")


def _verified_latest(root: Path) -> Amendment:
    """The latest amendment, once the history, the chain and its dates verify and the protocol loads."""
    check_history(root)
    amendments = read_amendments(root)
    verify_chain(amendments)
    check_dates(root, amendments)
    load(root / PROTOCOL_DIR)
    refuse_protocol_links(root)  # a pinned link would certify a file git does not hold
    return amendments[-1]


def _require_declared(latest: Amendment, files: Mapping[str, str], stages: Sequence[str]) -> None:
    """ProtocolError naming a changed file that a stage missing from ``stages`` reads."""
    changed = {rel for rel in set(files) | set(latest.pins) if files.get(rel) != latest.pins.get(rel)}
    undeclared = {s: rel for s, rel in _affected_stages(changed).items() if s not in stages}
    if undeclared:
        stage, rel = sorted(undeclared.items())[0]
        raise ProtocolError(
            f"{rel}: changed since {latest.rel}, and stage {stage!r} reads it but is not among the amendment's stages"
        )


def _data_pins(root: Path, latest: Amendment,
               pins: Mapping[str, str | Path]) -> tuple[dict[str, str], dict[str, Any]]:
    """The latest data pins and their environments, with ``pins`` re-pinned from their files."""
    data_pins, pin_envs = latest.data_pins, latest.data_pin_environments
    for name, path in pins.items():
        file = _resolve(root, name, path)
        data_pins[name] = data_digest(file)
        env = made_in(file)
        if env is None:
            pin_envs.pop(name, None)
        else:
            pin_envs[name] = env
    return data_pins, pin_envs


def _write_record(root: Path, record: Mapping[str, Any]) -> Path:
    """The record as amendments/<id>.yaml, valid against its schema, written whole or not at all."""
    target = root / AMENDMENTS_DIR / f"{record['id']}.yaml"
    text = yaml.dump(dict(record), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    validate(parse_yaml(text, str(target)), "amendment.schema.yaml", str(target))
    if target.exists():
        raise ProtocolError(f"{target}: already exists")
    # The temporary file lives in the project root, not in amendments/, where a concurrent gate
    # would take it for a stray record.
    handle, tmp = tempfile.mkstemp(prefix=f".{record['id']}.", suffix=".tmp", dir=root)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def amend(
    project_root: Path,
    summary: str,
    rationale: str,
    stages: Sequence[str],
    status: str,
    pins: Mapping[str, str | Path] | None = None,
) -> Path:
    """Write amendments/A-NNNN.yaml for the protocol as it is now; return its path.

    ``pins`` maps a data artifact name to its file (relative paths are taken from the project
    root); its digest is `pins.data_digest` (SHA-256 of the file). The chain and history must
    verify and the protocol must load before anything is written; the gate must accept the
    result, otherwise the new file is removed again.
    """
    root = Path(project_root)
    _check_arguments(summary, rationale, stages, status)
    latest = _verified_latest(root)
    files = protocol_files_on_disk(root)
    _require_declared(latest, files, stages)
    data_pins, pin_envs = _data_pins(root, latest, pins or {})
    record: dict[str, Any] = {
        "id": amendment_name(latest.number + 1),
        "date": dt.datetime.now(dt.UTC).date().isoformat(),
        "status": status,
        "summary": summary.strip(),
        "rationale": rationale.strip(),
        "stages": [s for s in STAGE_FILES if s in stages],
        "previous_sha256": latest.sha256,
        "pins": dict(sorted(files.items())),
    }
    if data_pins:
        record["data_pins"] = dict(sorted(data_pins.items()))
    if pin_envs:
        record["data_pin_environments"] = dict(sorted(pin_envs.items()))
    target = _write_record(root, record)
    try:
        gate(root)
    except ProtocolError:
        target.unlink()
        raise
    return target


def _data_pin(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--pin {text!r}: expected NAME=PATH")
    name, path = text.split("=", 1)
    return name, path


def main(argv: list[str] | None = None) -> int:
    """`int8alibi amend --summary S --rationale R --stages a,b --status pre-data [--pin NAME=PATH]`."""
    parser = argparse.ArgumentParser(prog="int8alibi amend", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."), help="project root (default: .)")
    parser.add_argument("--summary", required=True)
    parser.add_argument("--rationale", required=True)
    parser.add_argument("--stages", required=True, help=f"comma-separated, from: {','.join(STAGE_FILES)}")
    parser.add_argument("--status", required=True, choices=STATUSES)
    parser.add_argument(
        "--pin",
        action="append",
        type=_data_pin,
        default=[],
        metavar="NAME=PATH",
        help="pin a data artifact by its sha256 (repeatable)",
    )
    args = parser.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    try:
        if not args.root.is_dir():
            raise ProtocolError(f"--root {args.root}: not a folder (the project checkout holding amendments/)")
        path = amend(args.root, args.summary, args.rationale, stages, args.status, dict(args.pin))
    except Int8AlibiError as exc:
        print(printable(f"int8alibi amend: {exc}"), file=sys.stderr)
        return 1
    print(f"wrote {path}")
    print(f"next: `snakemake -n` lists the stages that rerun (those reading a changed file, among: "
          f"{', '.join(s for s in STAGE_FILES if s in stages)}) and `snakemake --cores N` reruns them; commit the "
          f"amendment with the files it pins (git add {AMENDMENTS_DIR}/ {PROTOCOL_DIR}/ && git commit), after which "
          "the history check holds it as append-only")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

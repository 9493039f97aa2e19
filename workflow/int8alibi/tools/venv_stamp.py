"""What ./bootstrap records in each virtualenv it builds, and what it decides from that record.

A virtualenv is right for this checkout only while it holds what bootstrap installed there, for
this checkout: the locks it was built from (digested with the installer and pyproject.toml), every
installed distribution's name and version (read from their metadata after the install), and the
checkout's real path (the editable install and every script's shebang hold absolute paths, so the
venv of a copied checkout runs the original's code, and a moved one's does not start). Any
difference but a changed lock file means the venv is rebuilt from nothing: reinstalling the pins
into it would neither take a swapped torch build back (its version number still matches) nor
rewrite a shebang. Standard library only: bootstrap runs it with the system Python, before any
virtualenv exists; ``workflow/envs/install`` runs it with the target's Python to refuse a lock the target
was not built from.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from importlib.metadata import distributions
from pathlib import Path
from urllib.parse import unquote, urlparse

# The environments (the locks, their installer, the conda files), relative to the checkout's root: in
# the workflow folder, where the Snakemake workflow catalog's layout keeps them. Here, beside the
# stamp that reads them, and not in a module the stages import: moving it reruns no stage.
ENVS = "workflow/envs"
STAMP = ".int8alibi-setup"
FORMAT = "int8alibi-venv/1"
PACKAGE = "int8alibi"
# A lock installed on top of another one: vLLM's own pins go over the GPU set, in its venv only.
ADD_ONS = {"vllm": "gpu"}
# The command that builds the venv a lock belongs in (for refusals that say what to run).
HOW = {"cpu": "./bootstrap pipeline -n", "llmcompressor": "./bootstrap pipeline -n", "gpu": "./bootstrap gpu -n",
       "vllm": "INT8ALIBI_VLLM=1 ./bootstrap gpu -n"}


class StampError(Exception):
    """A lock that cannot be installed into this environment: the message says why and what to run."""


@dataclass(frozen=True)
class Decision:
    """What bootstrap does with a venv: ``ok`` (nothing), ``create`` (none there), ``install`` (the
    pins into it as it is: only the lock files changed) or ``rebuild`` (empty it, then install)."""

    action: str
    reason: str


def lock_file(lock: str) -> str:
    """A lock's file, relative to the checkout's root (how the messages name it, too)."""
    return f"{ENVS}/{lock}.txt"


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def site_packages(venv: Path) -> list[Path]:
    return sorted(venv.glob("lib/python*/site-packages"))


def installed(venv: Path) -> dict[str, str]:
    """Every distribution in the venv's site-packages: normalized name -> version (the local label
    included, so torch's CPU and CUDA builds of one release differ)."""
    found: dict[str, str] = {}
    for dist in distributions(path=[str(p) for p in site_packages(venv)]):
        name = dist.metadata["Name"]
        if name:
            found[_name(name)] = dist.version
    return dict(sorted(found.items()))


def editable_root(venv: Path) -> str | None:
    """The checkout this package's editable install points at (its ``direct_url.json``), or None."""
    for site in site_packages(venv):
        for info in site.glob(f"{PACKAGE}-*.dist-info/direct_url.json"):
            try:
                url = json.loads(info.read_text()).get("url", "")
            except (OSError, ValueError):
                return None
            parsed = urlparse(url)
            return unquote(parsed.path) if parsed.scheme == "file" else None
    return None


def inputs_digest(root: Path, locks: Sequence[str]) -> str:
    """The locks' bytes with the installer's and pyproject.toml's: a change reinstalls the pins."""
    digest = hashlib.sha256()
    for rel in [*(lock_file(lock) for lock in locks), f"{ENVS}/install", "pyproject.toml"]:
        digest.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return digest.hexdigest()


def stamp_record(venv: Path, root: Path, locks: Sequence[str]) -> dict[str, object]:
    return {"format": FORMAT, "locks": list(locks), "inputs": inputs_digest(root, locks),
            "root": os.path.realpath(root), "installed": installed(venv)}


def read_stamp(venv: Path) -> dict[str, Any] | None:
    """The venv's stamp; None when absent or not this format (an older bootstrap wrote a bare digest)."""
    try:
        stamp = json.loads((venv / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) and stamp.get("format") == FORMAT else None


def _changes(was: Mapping[str, str], now: Mapping[str, str], most: int = 4) -> str:
    parts = [f"{n} {was[n]} -> {now[n]}" for n in was if n in now and was[n] != now[n]]
    parts += [f"+{n} {now[n]}" for n in now if n not in was] + [f"-{n} {was[n]}" for n in was if n not in now]
    more = f" and {len(parts) - most} more" if len(parts) > most else ""
    return ", ".join(parts[:most]) + more


def decide(venv: Path, root: Path, locks: Sequence[str]) -> Decision:
    """What bootstrap must do so that ``venv`` holds ``locks`` for the checkout at ``root``."""
    if not os.access(venv / "bin" / "python", os.X_OK):
        return Decision("create", f"{venv.name} does not exist")
    stamp = read_stamp(venv)
    if stamp is None:
        return Decision("rebuild", f"{venv.name} has no stamp saying what it holds "
                                   "(an older bootstrap made it, or not bootstrap)")
    here = os.path.realpath(root)
    if stamp.get("root") != here:
        return Decision("rebuild", f"{venv.name} was built for {stamp.get('root')}, not {here} "
                                   "(a copied or moved checkout)")
    editable = editable_root(venv)
    if editable is not None and os.path.realpath(editable) != here:
        return Decision("rebuild", f"{venv.name} runs the package of {editable}, not {here}")
    if stamp.get("locks") != list(locks):
        was = ", ".join(lock_file(lock) for lock in stamp.get("locks") or [])
        return Decision("rebuild", f"{venv.name} holds {was}, not " + ", ".join(lock_file(lock) for lock in locks))
    recorded = stamp.get("installed")
    now = installed(venv)
    if not isinstance(recorded, dict) or recorded != now:
        return Decision("rebuild", f"{venv.name}'s packages changed since bootstrap installed them: "
                                   + _changes(recorded if isinstance(recorded, dict) else {}, now))
    if stamp.get("inputs") != inputs_digest(root, locks):
        return Decision("install", f"{', '.join(lock_file(lock) for lock in locks)}, {ENVS}/install or "
                                   "pyproject.toml changed")
    return Decision("ok", f"{venv.name} holds {', '.join(lock_file(lock) for lock in locks)}")


def check_install(prefix: Path, lock: str) -> None:
    """Refuse to install ``lock`` into the environment at ``prefix`` when bootstrap built it from
    another lock (a swapped torch there would change every stage's bytes unnoticed)."""
    stamp = read_stamp(prefix)
    if stamp is None:
        return  # not built by bootstrap (a conda environment, a user's own): nothing recorded to keep
    base = list(stamp.get("locks") or [])
    if base[:1] == [ADD_ONS.get(lock, lock)]:
        return
    held = ", ".join(lock_file(name) for name in base)
    raise StampError(f"{ENVS}/install: {prefix} was built by ./bootstrap from {held}; {lock_file(lock)} goes into "
                     f"an environment of its own: run {HOW.get(lock, './bootstrap')}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m int8alibi.tools.venv_stamp", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("decide", "record"):
        p = sub.add_parser(cmd)
        p.add_argument("venv", type=Path)
        p.add_argument("locks", nargs="+")
        p.add_argument("--root", type=Path, default=Path.cwd())
    p = sub.add_parser("check-install")
    p.add_argument("lock")
    args = parser.parse_args(argv)
    if args.cmd == "decide":
        decision = decide(args.venv, args.root, args.locks)
        print(f"{decision.action}\t{decision.reason}")
    elif args.cmd == "record":
        tmp = args.venv / f"{STAMP}.tmp"
        tmp.write_text(json.dumps(stamp_record(args.venv, args.root, args.locks), indent=1) + "\n")
        tmp.replace(args.venv / STAMP)
    else:
        try:
            check_install(Path(sys.prefix), args.lock)
        except StampError as exc:
            print(exc, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

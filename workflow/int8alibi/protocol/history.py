"""The append-only rule, checked in git history from the lock commit on.

The lock is the commit that first adds amendments/LOCK, committed together with the amendments in
their final form. From that commit on, no commit may modify, rename or delete anything under
amendments/ (only additions), and the working tree may not hold an uncommitted change or deletion
of a committed amendment; an untracked new amendment is allowed, which is how `amend` works.
Before the lock the amendments are drafts. Without git the check cannot run, and the result says
so instead of passing.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
from collections.abc import Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import ProtocolError
from .chain import Amendment, amendment_date
from .pins import AMENDMENTS_DIR, LOCK_FILE

HistoryStatus = Literal["verified", "partial", "drafting", "not possible"]

# Variables that would point git at another repository or index (`git rev-parse --local-env-vars`).
_REPO_ENV = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_OBJECT_DIRECTORY",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_GRAFT_FILE",
    "GIT_INDEX_FILE",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_REPLACE_REF_BASE",
    "GIT_PREFIX",
    "GIT_INTERNAL_SUPER_PREFIX",
    "GIT_SHALLOW_FILE",
    "GIT_COMMON_DIR",
)
_VERBS = {"M": "modified", "D": "deleted", "R": "renamed", "T": "changed in type", "C": "copied", "U": "left unmerged"}


@dataclass(frozen=True)
class History:
    """Outcome of the history check: status, what was checked, and the lock commit if any."""

    status: HistoryStatus
    detail: str
    lock_commit: str | None = None


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _REPO_ENV}
    env["GIT_OPTIONAL_LOCKS"] = "0"  # read-only: never take the index lock
    return subprocess.run(
        ["git", "-c", "core.quotePath=false", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _git_ok(root: Path, *args: str) -> str:
    done = _git(root, *args)
    if done.returncode != 0:
        raise ProtocolError(
            f"{root}: `git {' '.join(args)}` failed, so the amendment history cannot be verified: {done.stderr.strip()}"
        )
    return done.stdout


def _violations(lines: list[str]) -> list[tuple[str, str, str]]:
    """(commit, path, verb) for every non-addition in `git log --name-status` output."""
    found = []
    commit = ""
    for line in lines:
        if line.startswith("commit "):
            commit = line.split()[1]
        elif "\t" in line:
            status, path = line.split("\t", 1)
            bad = [c for c in status if c != "A" and c.isalpha()]
            if bad:
                found.append((commit, path.split("\t")[-1], _VERBS.get(bad[0], f"changed ({status})")))
    return found


def _uncommitted(root: Path) -> list[tuple[str, str]]:
    """(path, verb) for committed files under amendments/ changed in the index or the work tree."""
    found = []
    for cached in ((), ("--cached",)):
        out = _git_ok(
            root, "diff", *cached, "--relative", "--no-renames", "--name-status", "HEAD", "--", f"{AMENDMENTS_DIR}/"
        )
        for line in out.splitlines():
            status, path = line.split("\t", 1)
            if status != "A":
                found.append((path, _VERBS.get(status[0], f"changed ({status})")))
    return sorted(set(found))


def _more(items: Sized) -> str:
    return f" ({len(items) - 1} further violations)" if len(items) > 1 else ""


def check_history(project_root: Path) -> History:
    """Verify the append-only rule in git, or say why it could not be verified.

    Raises ProtocolError naming the amendment file, the commit and what happened to it.
    """
    root = Path(project_root)
    if shutil.which("git") is None:
        return History("not possible", "history check not possible: git is not installed")
    inside = _git(root, "rev-parse", "--is-inside-work-tree")
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        if (root / ".git").exists():
            raise ProtocolError(f"{root / '.git'}: present but git cannot read the repository: {inside.stderr.strip()}")
        return History("not possible", f"history check not possible: {root} is not a git checkout (no .git)")
    if _git(root, "rev-parse", "--verify", "--quiet", "HEAD").returncode != 0:
        return History("drafting", "drafting: the repository has no commits yet, so the lock is not in history")
    adds = _git_ok(
        root, "log", "--full-history", "--topo-order", "--reverse", "--diff-filter=A", "--format=%H", "--", LOCK_FILE
    )
    lock = next(iter(adds.split()), None)
    if lock is None:
        where = "exists but is not committed" if (root / LOCK_FILE).exists() else "has never been committed"
        return History("drafting", f"drafting: {LOCK_FILE} {where}; amendments may still change until it is committed")
    log = _git_ok(
        root,
        "log",
        "--ancestry-path",
        "--full-history",
        "--no-renames",
        "--relative",
        "-c",
        "--name-status",
        "--format=commit %H",
        f"{lock}..HEAD",
        "--",
        f"{AMENDMENTS_DIR}/",
    )
    lines = log.splitlines()
    committed = _violations(lines)
    if committed:
        commit, path, verb = committed[-1]  # git lists newest first: report the earliest
        raise ProtocolError(
            f"{path}: {verb} in commit {commit[:12]}, after the lock commit {lock[:12]}; amendments are "
            f"append-only (restore the record and add a new amendment instead){_more(committed)}"
        )
    pending = _uncommitted(root)
    if pending:
        path, verb = pending[0]
        raise ProtocolError(
            f"{path}: uncommitted change ({verb}) to a committed amendment; amendments are append-only{_more(pending)}"
        )
    commits = sum(1 for line in lines if line.startswith("commit "))
    checked = (
        f"amendments/ append-only since lock commit {lock[:12]} ({commits} later commits touch it, additions only)"
    )
    if _git_ok(root, "rev-parse", "--is-shallow-repository").strip() == "true":
        if lock in _shallow_boundary(root):  # every file looks added there: the real lock may be older
            return History(
                "partial",
                f"history check partial: shallow clone whose oldest commit {lock[:12]} already holds {LOCK_FILE}; "
                f"which commit added it (the lock commit) cannot be told here; {checked.replace('lock commit', 'commit')}",
                None,
            )
        return History(
            "partial",
            f"history check partial: shallow clone, commits before the clone's depth are not available; {checked}",
            lock,
        )
    return History("verified", checked, lock)


def _shallow_boundary(root: Path) -> set[str]:
    """The commits a shallow clone stops at (their parents are not in it)."""
    shallow = Path(_git_ok(root, "rev-parse", "--git-path", "shallow").strip())
    path = shallow if shallow.is_absolute() else root / shallow
    return set(path.read_text().split()) if path.is_file() else set()


# A date is written in some time zone; none is more than 14 hours ahead of UTC.
_LATEST_ZONE = dt.timedelta(hours=14)


def _added(root: Path) -> dict[str, tuple[str, dt.datetime]]:
    """amendments/ file -> (commit, committer time) of the commit that first added it; empty without git."""
    if shutil.which("git") is None or _git(root, "rev-parse", "--verify", "--quiet", "HEAD").returncode != 0:
        return {}
    done = _git(root, "log", "--full-history", "--diff-filter=A", "--no-renames", "--relative",
                "--format=commit %H %ct", "--name-only", "--", f"{AMENDMENTS_DIR}/")
    if done.returncode != 0:
        return {}
    added: dict[str, tuple[str, dt.datetime]] = {}
    commit: tuple[str, dt.datetime] | None = None
    for line in done.stdout.splitlines():  # newest first: the last commit seen for a file added it
        if line.startswith("commit "):
            _, sha, stamp = line.split()
            commit = (sha, dt.datetime.fromtimestamp(int(stamp), dt.UTC))
        elif line.strip() and commit is not None:
            added[line.strip()] = commit
    return added


def check_dates(project_root: Path, amendments: Sequence[Amendment], now: dt.datetime | None = None) -> None:
    """No amendment is dated after the commit that added it (an uncommitted one: after now), in any
    time zone. A date in the future would make every later amendment look older than it, so that
    `amend` could never succeed again. Committer times are what git records; they can be set by hand,
    so this bounds honest mistakes and careless edits, not a forger of history."""
    added = _added(Path(project_root))
    now = now or dt.datetime.now(dt.UTC)
    for amendment in amendments:
        date = amendment_date(amendment)
        commit, when = added.get(amendment.rel, (None, now))
        if date > (when + _LATEST_ZONE).date():
            after = (f"the commit {commit[:12]} that added it ({when:%Y-%m-%d %H:%M} UTC)" if commit is not None
                     else f"today ({now:%Y-%m-%d} UTC; the file is not committed yet)")
            raise ProtocolError(f"{amendment.rel}: dated {date.isoformat()}, after {after}; an amendment is dated "
                                "the day it is written")

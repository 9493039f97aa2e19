"""``code.git.dirty`` means the code or protocol that ran differs from the commit: the README's recipes
(a results copy to diff against, Snakemake's report archive, conform's folder) leave it False under
the project's own .gitignore, while an edit, a new source file or a look-alike outside those names
still makes it True."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from int8alibi.provenance.environment import git_state

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _recipe_outputs() -> dict[str, str]:
    """What the README's code blocks write into the checkout besides results/: ``cp -r`` targets,
    ``--report`` archives and ``--out`` folders, each with the kind of thing it is."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", (ROOT / "README.md").read_text(encoding="utf-8"), re.M | re.S)
    text = "\n".join(blocks)
    out = {m: "copy" for m in re.findall(r"\bcp -r results (\S+)", text)}
    out.update({m: "file" for m in re.findall(r"--report (\S+)", text)})
    out.update({m: "folder" for m in re.findall(r"--out (\S+)", text)})
    return out


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A committed checkout with the project's .gitignore, a module, a protocol file and a run's results."""
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-global-gitconfig"))  # no user excludes
    root = tmp_path / "checkout"
    (root / "workflow" / "pkg").mkdir(parents=True)
    (root / "preregistration").mkdir()
    shutil.copyfile(ROOT / ".gitignore", root / ".gitignore")
    (root / "workflow" / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "preregistration" / "faults.yaml").write_text("seed: 1\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "one")
    (root / "results" / "faults").mkdir(parents=True)
    (root / "results" / "faults" / "manifest.json").write_text("{}\n")
    for folder in ("logs", "benchmarks", ".snakemake"):
        (root / folder).mkdir()
        (root / folder / "x").write_text("")
    assert git_state(root)["dirty"] is False
    return root


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
                          check=True, capture_output=True, text=True).stdout


def test_the_readme_names_the_outputs_this_test_follows() -> None:
    assert _recipe_outputs() == {"results-before": "copy", "report.zip": "file", "conform/": "folder"}


def test_the_readme_recipes_leave_the_checkout_clean(checkout: Path) -> None:
    for name, kind in _recipe_outputs().items():
        target = checkout / name
        if kind == "copy":
            shutil.copytree(checkout / "results", target)
        elif kind == "file":
            target.write_bytes(b"PK\x05\x06" + bytes(18))
        else:
            target.mkdir()
            (target / "conformance.parquet").write_bytes(b"PAR1")
    (checkout / "results-after-amendment").mkdir()               # any results-* copy, not only the README's
    (checkout / "results-after-amendment" / "manifest.json").write_text("{}\n")
    assert git_state(checkout) == {"commit": _git(checkout, "rev-parse", "HEAD").strip(), "dirty": False}


@pytest.mark.parametrize("edit", ["code", "protocol", "new module", "new top-level file"])
def test_a_change_to_what_runs_is_still_dirty(checkout: Path, edit: str) -> None:
    shutil.copytree(checkout / "results", checkout / "results-before")
    if edit == "code":
        (checkout / "workflow" / "pkg" / "mod.py").write_text("X = 2\n")
    elif edit == "protocol":
        (checkout / "preregistration" / "faults.yaml").write_text("seed: 2\n")
    elif edit == "new module":
        (checkout / "workflow" / "pkg" / "extra.py").write_text("")
    else:
        (checkout / "Snakefile.local").write_text("")
    assert git_state(checkout)["dirty"] is True


@pytest.mark.parametrize("path", ["results-x.py", "results-", "report.zip.py", "workflow/report.zip",
                                  "workflow/results-before/mod.py", "workflow/conform/mod.py", "conform.py"])
def test_the_ignore_rules_stop_at_their_names(checkout: Path, path: str) -> None:
    """Top-level folders results-* and conform/ and the file report.zip only: a file that merely starts
    the same way, or the same name inside the package, still counts as a change."""
    (checkout / path).parent.mkdir(parents=True, exist_ok=True)
    (checkout / path).write_text("")
    assert git_state(checkout)["dirty"] is True

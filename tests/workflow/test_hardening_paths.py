"""Names that become paths or imports, and paths that are not what they claim, through `snakemake -n`
on a scratch copy of the project: each is one `int8alibi:` line naming the value and the reason, no
traceback, nothing written or imported (an arm name that leaves its folder, a dotted GGUF package,
results under another checkout's amendments/ or naming a file, a committed amendment that is a link)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SNAKEMAKE, TINY_CONFIG, copy_project

pytestmark = pytest.mark.slow  # runs Snakemake

BIN = Path(sys.executable).parent


def _dry_run(repo: Path, config: str, *extra: str, env: dict[str, str] | None = None) -> str:
    """The one ``int8alibi:`` line of a refused ``snakemake -n`` (asserting it was refused cleanly)."""
    (repo / "config" / "case.yaml").write_text(config)
    done = subprocess.run([str(SNAKEMAKE), "-n", "--cores", "1", "--configfile", "config/case.yaml", *extra],
                          cwd=repo, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **(env or {})})
    out = done.stdout + done.stderr
    lines = [line for line in out.splitlines() if line.startswith("int8alibi: ")]
    assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in out, out[-3000:]
    return lines[0]


def test_names_and_files_that_would_escape_or_mislead_are_refused_while_planning(tmp_path: Path) -> None:
    repo = copy_project(tmp_path / "project")
    before = sorted(p.name for p in tmp_path.iterdir())

    line = _dry_run(repo, TINY_CONFIG.replace("arms: auto", "arms: ['../../escape:f', exact-triton-order]"))
    assert "arms/0: '../../escape:f' does not match" in line, line

    marker = tmp_path / "imported"
    package = tmp_path / "site" / "markpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    gguf = TINY_CONFIG.replace("  source: synthetic\n", "  source: gguf-package\n  gguf_package: markpkg.sub\n")
    line = _dry_run(repo, gguf, env={"PYTHONPATH": str(tmp_path / "site")})
    assert "model/gguf_package: 'markpkg.sub' does not match" in line and not marker.exists(), line

    other = tmp_path / "other"
    for name in ("amendments", "preregistration"):
        (other / name).mkdir(parents=True)
    (other / "Snakefile").write_text("# another checkout\n")
    line = _dry_run(repo, TINY_CONFIG, "--config", "results=amendments", f"results_root={other}")
    assert f"results '{other}/amendments' resolves to" in line and "project's own folder amendments/" in line, line
    assert sorted(p.name for p in (other / "amendments").iterdir()) == []

    line = _dry_run(repo, TINY_CONFIG, "--config", "results=README.md")
    assert "results 'README.md' resolves to" in line and "is an existing file, not a folder" in line, line

    outside = tmp_path / "A-9999.yaml"
    outside.write_text("id: A-9999\n")
    link = repo / "amendments" / f"A-{len(list((repo / 'amendments').glob('A-*.yaml'))) + 1:04d}.yaml"
    link.symlink_to(outside)
    subprocess.run(["git", "add", link.relative_to(repo).as_posix()], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@invalid", "commit", "-qm", "a linked amendment"],
                   cwd=repo, check=True)
    line = _dry_run(repo, TINY_CONFIG)
    assert f"amendments/{link.name}: a symbolic link (to {outside})" in line, line

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "site", "other", "A-9999.yaml"])
    assert not (repo / "results").exists() and not (repo / "logs").exists()


def test_plan_caches_that_cannot_be_written_only_warn(tmp_path: Path) -> None:
    """A .snakemake/ the plan cannot write (here its cache folder is a file, which even root cannot
    write into) costs the next plan its caches, not the plan: one warning line, exit 0."""
    repo = copy_project(tmp_path / "project")
    (repo / ".snakemake").mkdir(exist_ok=True)
    (repo / ".snakemake" / "int8alibi").write_text("not a folder")
    config = TINY_CONFIG.replace("arms: auto", "arms: [exact-cutlass-order, exact-triton-order]")
    (repo / "config" / "case.yaml").write_text(config)
    done = subprocess.run([str(SNAKEMAKE), "-n", "--cores", "1", "--configfile", "config/case.yaml"], cwd=repo,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"})
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in out, out[-3000:]
    assert "int8alibi: plan caches not saved:" in out, out[-3000:]

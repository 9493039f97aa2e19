"""bootstrap's record of each virtualenv: a changed lock reinstalls, anything else that changed (the
installed packages, the locks, the checkout's path) rebuilds, and workflow/envs/install refuses another lock.

Fake virtualenvs (a dist-info per package, a stamp) stand in for real ones where only the decision
is tested; the tests that run ./bootstrap or workflow/envs/install use real virtualenvs, built from tiny locks
where a build is tested."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from int8alibi.tools.venv_stamp import ENVS, STAMP, StampError, check_install, decide, installed, main, read_stamp

PROJECT = Path(__file__).resolve().parents[2]
# what ./bootstrap and workflow/envs/install read: a checkout reduced to them
CHECKOUT_FILES = ["bootstrap", "pyproject.toml", "README.md", "LICENSE", "workflow/int8alibi/__init__.py",
                  "workflow/int8alibi/tools/__init__.py", "workflow/int8alibi/tools/venv_stamp.py"]


def _checkout(dest: Path) -> Path:
    for rel in CHECKOUT_FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PROJECT / rel, dest / rel)
    shutil.copytree(PROJECT / ENVS, dest / ENVS)
    return dest


def _dist(venv: Path, name: str, version: str, url: str | None = None) -> None:
    info = venv / "lib" / "python3.11" / "site-packages" / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if url:
        (info / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True}, "url": url}))


def _fake_venv(root: Path, name: str = ".venv", locks: tuple[str, ...] = ("cpu",)) -> Path:
    """A venv as bootstrap leaves it: an interpreter, torch's CPU build, this package editable, the stamp."""
    venv = root / name
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    _dist(venv, "torch", "2.13.0+cpu")
    _dist(venv, "int8alibi", "0.1.0", url=root.resolve().as_uri())
    assert main(["record", str(venv), *locks, "--root", str(root)]) == 0
    return venv


def _swap(venv: Path, name: str, old: str, new: str) -> None:
    shutil.rmtree(next(venv.glob(f"lib/python*/site-packages/{name}-{old}.dist-info")))
    _dist(venv, name, new)


def test_a_venv_as_recorded_is_kept_and_a_changed_lock_reinstalls(tmp_path: Path) -> None:
    root = _checkout(tmp_path / "ck")
    assert decide(root / ".venv", root, ["cpu"]).action == "create"
    venv = _fake_venv(root)
    stamp = read_stamp(venv)
    assert stamp and stamp["locks"] == ["cpu"] and stamp["root"] == os.path.realpath(root)
    assert stamp["installed"] == {"int8alibi": "0.1.0", "torch": "2.13.0+cpu"} == installed(venv)
    assert decide(venv, root, ["cpu"]).action == "ok"
    with open(root / ENVS / "cpu.txt", "a") as lock:
        lock.write("# a changed lock\n")
    assert decide(venv, root, ["cpu"]).action == "install"


def test_a_changed_installed_set_is_rebuilt_naming_the_change(tmp_path: Path) -> None:
    root = _checkout(tmp_path / "ck")
    venv = _fake_venv(root)
    _swap(venv, "torch", "2.13.0+cpu", "2.13.0")  # what `workflow/envs/install gpu .venv/bin/python` did
    got = decide(venv, root, ["cpu"])
    assert got.action == "rebuild" and "torch 2.13.0+cpu -> 2.13.0" in got.reason, got
    venv = _fake_venv(_checkout(tmp_path / "ck2"))
    _dist(venv, "vllm", "0.26.0")
    got = decide(venv, tmp_path / "ck2", ["cpu"])
    assert got.action == "rebuild" and "+vllm 0.26.0" in got.reason, got


def test_a_copied_or_moved_checkout_is_rebuilt(tmp_path: Path) -> None:
    root = _checkout(tmp_path / "ck")
    _fake_venv(root)
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, symlinks=True)
    got = decide(copy / ".venv", copy, ["cpu"])
    assert got.action == "rebuild" and f"built for {os.path.realpath(root)}" in got.reason, got
    assert "copied or moved" in got.reason
    moved = tmp_path / "moved"
    root.rename(moved)
    assert decide(moved / ".venv", moved, ["cpu"]).action == "rebuild"
    # the stamp rewritten for the new path, the editable install still pointing at the old one
    assert main(["record", str(moved / ".venv"), "cpu", "--root", str(moved)]) == 0
    got = decide(moved / ".venv", moved, ["cpu"])
    assert got.action == "rebuild" and f"package of {root}" in got.reason, got


def test_other_locks_or_an_older_stamp_rebuild(tmp_path: Path) -> None:
    root = _checkout(tmp_path / "ck")
    venv = _fake_venv(root, ".venv-gpu", ("gpu",))
    got = decide(venv, root, ["gpu", "vllm"])
    assert got.action == "rebuild" and f"holds {ENVS}/gpu.txt, not {ENVS}/gpu.txt, {ENVS}/vllm.txt" in got.reason, got
    (venv / STAMP).write_text("fbcaa30ee071c63725b27f61df2d201202b34852543d4f390c97e093483fbd0a\n")  # the old stamp
    assert decide(venv, root, ["gpu"]).action == "rebuild"


def test_envs_install_refuses_a_lock_the_venv_was_not_built_from(tmp_path: Path) -> None:
    cpu = _fake_venv(_checkout(tmp_path / "ck"))
    with pytest.raises(StampError, match=rf"built by ./bootstrap from {ENVS}/cpu.txt; {ENVS}/gpu.txt .* ./bootstrap gpu"):
        check_install(cpu, "gpu")
    with pytest.raises(StampError, match="INT8ALIBI_VLLM=1 ./bootstrap gpu"):
        check_install(cpu, "vllm")
    check_install(cpu, "cpu")
    check_install(_fake_venv(tmp_path / "ck", ".venv-gpu", ("gpu",)), "vllm")  # vLLM goes over the GPU set
    check_install(tmp_path / "conda-env", "gpu")  # not built by bootstrap: nothing to keep


def test_envs_install_stops_before_pip_in_a_venv_stamped_for_another_lock(tmp_path: Path) -> None:
    root = _checkout(tmp_path / "ck")
    venv = root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert main(["record", str(venv), "cpu", "--root", str(root)]) == 0
    before = (venv / STAMP).read_bytes()
    result = subprocess.run([str(root / ENVS / "install"), "gpu", str(venv / "bin" / "python")],
                            capture_output=True, text=True)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and f"{ENVS}/gpu.txt goes into an environment of its own" in result.stderr
    assert (venv / STAMP).read_bytes() == before and installed(venv) == {}  # nothing installed (no pip there)


def _tree(path: Path) -> str:
    """A digest of every file's path, mode and bytes (links as their targets) under ``path``."""
    digest = hashlib.sha256()
    for item in sorted(path.rglob("*")):
        digest.update(str(item.relative_to(path)).encode() + oct(item.lstat().st_mode).encode())
        if item.is_symlink():
            digest.update(os.readlink(item).encode())
        elif item.is_file():
            digest.update(item.read_bytes())
    return digest.hexdigest()


def test_bootstrap_status_plans_the_gpu_environment_and_leaves_venv_alone(tmp_path: Path) -> None:
    root = _checkout(tmp_path / "ck")
    venv = _fake_venv(root)
    before = _tree(venv)
    lines = subprocess.run([str(root / "bootstrap"), "status"], capture_output=True, text=True, check=True,
                           env={**os.environ, "INT8ALIBI_VLLM": "1"}).stdout.splitlines()
    assert lines[0].startswith(".venv: ok (") and lines[1].startswith(".venv-llmcompressor: create (")
    assert lines[2] == ".venv-gpu: create (.venv-gpu does not exist)"
    assert _tree(venv) == before and not (root / ".venv-gpu").exists()


@pytest.mark.slow  # builds four real virtualenvs (pip, from tiny locks)
def test_bootstrap_gpu_builds_its_own_venv_and_rebuilds_a_copied_checkouts(tmp_path: Path) -> None:
    """`./bootstrap gpu` with tiny stand-in locks (setuptools only: what the editable install needs):
    .venv-gpu and .venv-llmcompressor are built and stamped, .venv keeps every byte; in a copy of the
    checkout both are rebuilt for the copy's path. The locks hold no Snakemake, so the final exec of
    .venv-gpu/bin/snakemake is where bootstrap hands over, and fails."""
    root = _checkout(tmp_path / "ck")
    setuptools = next(line for line in (PROJECT / ENVS / "gpu.txt").read_text().splitlines()
                      if line.startswith("setuptools=="))
    for lock in ("gpu", "llmcompressor"):
        (root / ENVS / f"{lock}.txt").write_text(setuptools + "\n")
    venv = _fake_venv(root)
    before = _tree(venv)

    def gpu(where: Path) -> subprocess.CompletedProcess:
        result = subprocess.run([str(where / "bootstrap"), "gpu", "--version"], capture_output=True, text=True,
                                timeout=900)
        assert result.returncode == 127 and ".venv-gpu/bin/snakemake" in result.stderr, result.stderr
        return result

    gpu(root)
    assert _tree(venv) == before
    for name, lock in ((".venv-gpu", "gpu"), (".venv-llmcompressor", "llmcompressor")):
        assert decide(root / name, root, [lock]).action == "ok"
        assert (read_stamp(root / name) or {}).get("installed", {}).get("int8alibi") == "0.1.0"
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, symlinks=True)
    assert decide(copy / ".venv-gpu", copy, ["gpu"]).action == "rebuild"
    log = gpu(copy).stderr
    assert f"bootstrap: rebuilding .venv-gpu: .venv-gpu was built for {os.path.realpath(root)}" in log
    assert decide(copy / ".venv-gpu", copy, ["gpu"]).action == "ok"
    assert (copy / ".venv-gpu" / "bin" / "pip").read_text().startswith(f"#!{copy}/.venv-gpu/bin/python")
    assert _tree(copy / ".venv") == before  # the copy's .venv (fake: built for the original) is left alone too

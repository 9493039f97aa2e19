"""Portable CPU bytes: the process settings under which every stage computes the same bytes on any x86-64.

PyTorch picks its CPU code by the machine: ATen's vectorized kernels by the detected instruction
set (scalar, AVX2, AVX-512), oneDNN's bf16 matmuls only where the CPU has AVX-512 (and by its own
ISA), MKL's GEMM code path by vendor and ISA, and reductions split by the thread count. Each choice
moves float bytes. Rather than record that the bytes moved, every stage runs under one fixed set:

* ``ATEN_CPU_CAPABILITY=default``: ATen's baseline kernels, which every x86-64 runs identically;
* ``MKL_CBWR=COMPATIBLE``: MKL's conditional-numerical-reproducibility branch, the one code path
  MKL documents as giving identical results on every Intel and compatible (AMD) processor;
* oneDNN switched off in torch (``torch.backends.mkldnn``), so no bf16 matmul takes a path that
  exists only on some CPUs;
* one intra-op thread in the stages that run the model's float forward pass (MKL's reproducible
  branch and ATen's parallel reductions depend on the thread count); Snakemake runs such jobs side
  by side instead.

The first two must be in the environment before torch starts, so Snakemake sets them for its jobs
(``apply_to_environ`` in the Snakefile) and a stage started by hand re-executes itself with them
(``ensure_process``). After torch has loaded, ``check_process`` verifies that every setting took
effect and stops the stage otherwise. ``PORTABLE_CPU=0`` switches the whole mechanism off (for the
test that shows what it prevents); manifests record which was in force.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

from .errors import InputError

PINNED_ENV: Mapping[str, str] = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
}
SWITCH = "PORTABLE_CPU"  # "0" switches the mechanism off; anything else (or unset) keeps it on
FORWARD_THREADS = 1
_REEXEC_MARK = "INT8ALIBI_PORTABLE_REEXEC"


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the portable settings are in force for this process (``PORTABLE_CPU`` not ``0``)."""
    return (environ if environ is not None else os.environ).get(SWITCH, "1") != "0"


def apply_to_environ(environ: MutableMapping[str, str] | None = None) -> None:
    """Put the pinned variables into ``environ`` (default ``os.environ``) for processes started later."""
    env = os.environ if environ is None else environ
    if enabled(env):
        env.update(PINNED_ENV)


def ensure_process(module: str, argv: list[str]) -> None:
    """Re-execute ``python -m module argv`` with the pinned variables if they are not in force.

    ATen reads its capability and MKL its branch when they first run, so setting the variables in
    a process that has already started is not enough; a fresh interpreter is. Once only: a
    re-executed process that still lacks them is left to ``check_process`` to stop.
    """
    if not enabled() or all(os.environ.get(k) == v for k, v in PINNED_ENV.items()):
        return
    if os.environ.get(_REEXEC_MARK):
        return
    env = dict(os.environ)
    env.update(PINNED_ENV)
    env[_REEXEC_MARK] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)


def configure_torch(*, forward: bool) -> None:
    """In-process settings: oneDNN off; one intra-op thread where the model's float forward runs."""
    if not enabled():
        return
    import torch

    torch.backends.mkldnn.enabled = False
    if forward:
        torch.set_num_threads(FORWARD_THREADS)


def check_process(*, forward: bool) -> None:
    """Stop unless every portable setting took effect in this process (InputError naming what did not)."""
    if not enabled():
        return
    import torch

    problems = []
    for name, value in PINNED_ENV.items():
        if os.environ.get(name) != value:
            problems.append(f"{name} is {os.environ.get(name, 'unset')!r}, not {value!r}")
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "DEFAULT":
        problems.append(f"torch runs its {capability} CPU kernels, not DEFAULT "
                        "(ATEN_CPU_CAPABILITY must be set before torch starts)")
    if torch.backends.mkldnn.enabled:
        problems.append("oneDNN is enabled in torch")
    if forward and torch.get_num_threads() != FORWARD_THREADS:
        problems.append(f"torch uses {torch.get_num_threads()} intra-op threads, not {FORWARD_THREADS}")
    if problems:
        raise InputError("portable CPU settings not in force on this host: " + "; ".join(problems)
                         + f" (run the stage through Snakemake or `python -m`, or set {SWITCH}=0 "
                         "to run without them and record that)")


STEERING_VARS = ("PORTABLE_CPU", "ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                 "DNNL_MAX_CPU_ISA", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_DYNAMIC", "KMP_AFFINITY")


def _cpu_info() -> tuple[str, list[str]]:
    """(CPU model name, sorted feature flags) from /proc/cpuinfo; ('unknown', []) where there is none."""
    try:
        text = open("/proc/cpuinfo", encoding="utf-8", errors="replace").read()
    except OSError:
        import platform

        return platform.processor() or "unknown", []
    model, flags = "unknown", []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Processor", "cpu model") and model == "unknown":
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = sorted(value.split())
    return model, flags


def detected_capability(flags: list[str]) -> str:
    """The ATen CPU capability torch would pick on these x86 flags without a pin (its own rule)."""
    have = set(flags)
    if not have:
        return "unknown"
    if {"avx512f", "avx512vl", "avx512bw", "avx512dq", "fma"} <= have:
        return "AVX512"
    if {"avx2", "fma"} <= have:
        return "AVX2"
    return "DEFAULT"


def facts() -> dict[str, Any]:
    """Every environment fact that could still move CPU bytes, for manifests and identity files."""
    import hashlib
    import platform

    import torch

    model, flags = _cpu_info()
    libc, libc_version = platform.libc_ver()
    return {
        "portable": enabled(),
        "cpu_model": model,
        "cpu_flags_sha256": hashlib.sha256(" ".join(flags).encode()).hexdigest(),
        "cpu_capability_detected": detected_capability(flags) if platform.machine() in ("x86_64", "AMD64") else "n/a",
        "cpu_capability_effective": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
        "intra_op_threads": torch.get_num_threads(),
        "libc": f"{libc} {libc_version}".strip() or "unknown",
        "steering": {name: os.environ.get(name, "unset") for name in STEERING_VARS},
    }

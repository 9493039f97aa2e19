"""Portable CPU bytes: the process settings under which every stage computes the same bytes on any x86-64.

PyTorch picks its CPU code by the machine: ATen's vectorized kernels by the detected instruction
set (scalar, AVX2, AVX-512), oneDNN's bf16 matmuls only where the CPU has AVX-512 (and by its own
ISA), MKL's GEMM code path by vendor and ISA, and reductions split by the thread count. Each choice
moves float bytes. Rather than record that the bytes moved, every stage runs under one fixed set:

* ``ATEN_CPU_CAPABILITY=default``: ATen's baseline kernels, which every x86-64 runs identically;
* ``MKL_CBWR=COMPATIBLE``: MKL's conditional-numerical-reproducibility branch, the one code path
  MKL documents as giving identical results on every Intel and compatible (AMD) processor;
* oneDNN switched off in torch (``torch.backends.mkldnn``), so no bf16 matmul takes a path that
  exists only on some CPUs (``arith.accumulate`` switches it on for one call, an int8 GEMM whose
  integer sums it has proven exact for that shape on this CPU);
* one intra-op thread in the stages that run the model's float forward pass or sum float
  statistics of its outputs (MKL's reproducible branch and ATen's parallel reductions depend on the
  thread count; ``planning.stage_needs.StageNeeds.pinned``); Snakemake runs such jobs side by side
  instead.

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


def configure_torch(*, pinned: bool) -> None:
    """In-process settings: oneDNN off; one intra-op thread in a ``pinned`` stage (a float forward
    pass or float statistics)."""
    if not enabled():
        return
    import torch

    torch.backends.mkldnn.enabled = False  # type: ignore[assignment]  # a module flag torch types as a descriptor
    if pinned:
        torch.set_num_threads(FORWARD_THREADS)


def check_process(*, pinned: bool) -> None:
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
    if pinned and torch.get_num_threads() != FORWARD_THREADS:
        problems.append(f"torch uses {torch.get_num_threads()} intra-op threads, not {FORWARD_THREADS}")
    if problems:
        raise InputError("portable CPU settings not in force on this host: " + "; ".join(problems)
                         + f" (run the stage through Snakemake or `python -m`, or set {SWITCH}=0 "
                         "to run without them and record that)")


STEERING_VARS = ("PORTABLE_CPU", "ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                 "DNNL_MAX_CPU_ISA", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_DYNAMIC", "KMP_AFFINITY")


# torch's own CPU probes (cpuinfo: CPUID and the OS's enabled register state) that ATen's dispatch
# and the AMX/VNNI/bf16 paths act on; recorded as ``cpu_features``.
TORCH_FEATURES = ("avx2", "fma3", "avx512_f", "avx512_vl", "avx512_bw", "avx512_dq", "avx512_vnni",
                  "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16")
# ATen's rule for its capability without a pin (DispatchStub's compute_cpu_capability on x86).
ATEN_RULE = (("AVX512", ("avx512_vl", "avx512_bw", "avx512_dq", "fma3")), ("AVX2", ("avx2", "fma3")))
# mkl_cbwr_get's branch codes (mkl_types.h), named as the MKL_CBWR variable spells them.
MKL_BRANCHES = {0: "OFF", 1: "BRANCH_OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 5: "SSE3", 6: "SSSE3",
                7: "SSE4_1", 8: "SSE4_2", 9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512",
                13: "AVX512_MIC_E1", 14: "AVX512_E1"}
MKL_CBWR_STRICT = 0x10000
# Where each fact of ``facts`` comes from, recorded beside them: the host's /proc/cpuinfo is only
# what the kernel shows this process (a container, VM or emulator may show another CPU's flags).
FACT_SOURCES = {
    "cpu_model": "host /proc/cpuinfo (model name)",
    "cpu_flags_sha256": "host /proc/cpuinfo (flags)",
    "cpu_features": "torch.cpu.get_capabilities (cpuinfo: CPUID and OS-enabled state)",
    "cpu_capability_detected": "ATen's dispatch rule on cpu_features (what torch picks without a pin)",
    "cpu_capability_effective": "torch.backends.cpu.get_cpu_capability",
    "mkl": "MKL's own reports (version string, mkl_cbwr_get, its auto branch) from torch's library",
}


def parse_cpuinfo(text: str) -> tuple[str, list[str]]:
    """(CPU model name, sorted feature flags) of /proc/cpuinfo's text: the first processor's entries
    (x86 ``model name``/``flags``, Arm ``Processor`` or ``cpu model``/``Features``)."""
    model, flags = "unknown", list[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Processor", "cpu model") and model == "unknown":
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = sorted(value.split())
    return model, flags


def _cpu_info() -> tuple[str, list[str]]:
    """The host's /proc/cpuinfo, parsed; the platform's processor name and no flags where there is none."""
    try:
        text = open("/proc/cpuinfo", encoding="utf-8", errors="replace").read()
    except OSError:
        import platform

        return platform.processor() or "unknown", []
    return parse_cpuinfo(text)


def torch_cpu_features() -> dict[str, bool] | str:
    """torch's own probes of this CPU (``TORCH_FEATURES``), or why there are none (no x86, an older torch)."""
    import torch

    probe = getattr(torch.cpu, "get_capabilities", None)
    if probe is None:
        return f"not reported by torch {torch.__version__} (no torch.cpu.get_capabilities)"
    found = probe()
    if found.get("architecture") not in ("x86_64", "x86"):
        return f"n/a ({found.get('architecture', 'unknown')} CPU)"
    return {name: bool(found.get(name, False)) for name in TORCH_FEATURES}


def detected_capability(features: Mapping[str, bool] | str) -> str:
    """The ATen capability torch picks on these probed features without a pin (``ATEN_RULE``)."""
    if isinstance(features, str):
        return features
    for capability, needs in ATEN_RULE:
        if all(features.get(name, False) for name in needs):
            return capability
    return "DEFAULT"


def mkl_branch_name(code: int) -> str:
    """An ``mkl_cbwr_get`` result as the ``MKL_CBWR`` variable spells it (``,STRICT`` kept; unknown codes named)."""
    strict = ",STRICT" if code & MKL_CBWR_STRICT else ""
    branch = code & ~MKL_CBWR_STRICT
    return MKL_BRANCHES.get(branch, f"code {branch}") + strict


def mkl_facts() -> dict[str, str] | str:
    """MKL's own reports from the copy inside torch: its version, the CBWR branch in force, and the
    branch it would pick by itself on this CPU (its detected code path); why not, where it has none.

    torch links MKL statically and exports MKL's service entry points under their ``mkl_serv_``
    names (``mkl_cbwr_get`` is ``mkl_serv_cbwr_get``); they are read through ctypes.
    """
    import ctypes

    import torch

    if not torch.backends.mkl.is_available():
        return "absent (torch built without MKL)"
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    try:
        lib = ctypes.CDLL(os.path.join(lib_dir, "libtorch_cpu.so"))
        version_string, cbwr_get, auto_branch = (
            lib.MKL_Get_Version_String, lib.mkl_serv_cbwr_get, lib.mkl_serv_cbwr_get_auto_branch)
    except (OSError, AttributeError) as exc:
        return f"not reported by this torch build ({exc})"
    buffer = ctypes.create_string_buffer(256)
    version_string.argtypes, version_string.restype = [ctypes.c_char_p, ctypes.c_int], None
    cbwr_get.argtypes, cbwr_get.restype = [ctypes.c_int], ctypes.c_int
    auto_branch.argtypes, auto_branch.restype = [], ctypes.c_int
    version_string(buffer, len(buffer))
    return {
        "version": buffer.value.decode("ascii", "replace"),
        "branch": mkl_branch_name(cbwr_get(1)),  # MKL_CBWR_BRANCH
        "auto_branch": mkl_branch_name(auto_branch()),
    }


def facts() -> dict[str, Any]:
    """Every environment fact that could still move CPU bytes, for manifests and identity files.

    Each CPU fact comes from the library that acts on it (``FACT_SOURCES``); the host's
    /proc/cpuinfo model name and flags digest are kept beside them, labelled as host facts.
    """
    import hashlib
    import platform

    import torch

    model, flags = _cpu_info()
    features = torch_cpu_features()
    libc, libc_version = platform.libc_ver()
    return {
        "portable": enabled(),
        "cpu_model": model,
        "cpu_flags_sha256": hashlib.sha256(" ".join(flags).encode()).hexdigest(),
        "cpu_features": features,
        "cpu_capability_detected": detected_capability(features),
        "cpu_capability_effective": torch.backends.cpu.get_cpu_capability(),
        "mkl": mkl_facts(),
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
        "intra_op_threads": torch.get_num_threads(),
        "libc": f"{libc} {libc_version}".strip() or "unknown",
        "steering": {name: os.environ.get(name, "unset") for name in STEERING_VARS},
        "sources": FACT_SOURCES,
    }

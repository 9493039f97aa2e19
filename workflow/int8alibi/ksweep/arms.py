"""The sweep's kernel arms per format: one callable from quantized operands to a bf16 output.

INT8 uses the project's registered arms (``kernels.registry``). FP8 e4m3 has four: PyTorch's
``torch._scaled_mm`` (cuBLASLt, row-wise float32 scales), vLLM's ``cutlass_scaled_mm`` and
``triton_scaled_mm``, which take e4m3 operands in the same layout as int8 (weight as a
column-major [K,N] view, scales [M,1] and [N,1]), and the project's ``triton-fp8``
(``ksweep.triton_fp8``), the second arm where vLLM is absent. Evidence names the binaries that ran: library
paths and digests, and the CUDA kernel names a profiler saw (CUTLASS names carry the tile shape).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import InputError
from ..kernels.base import package_version
from ..files.hashing import sha256_file
from .operands import FP8, Quantized

Runner = Callable[[Quantized], torch.Tensor]
VLLM_LIBRARY = "_C_stable_libtorch.abi3.so"


def _scaled_mm(q: Quantized) -> torch.Tensor:
    m, n = q.a_q.shape[0], q.w_q.shape[0]
    return torch._scaled_mm(q.a_q.contiguous(), q.w_q.contiguous().t(), scale_a=q.s_a.contiguous().view(m, 1),
                            scale_b=q.s_w.contiguous().view(1, n), out_dtype=torch.bfloat16)


def _vllm(kernel: str) -> Runner:
    from ..kernels.vllm_arms import resolve

    fn = resolve(kernel)  # type: ignore[arg-type]

    def run(q: Quantized) -> torch.Tensor:
        if q.a_q.dtype != FP8 or q.w_q.dtype != FP8:
            raise InputError(f"vllm-{kernel} (fp8): operands are {q.a_q.dtype}/{q.w_q.dtype}, expected {FP8}")
        m, n = q.a_q.shape[0], q.w_q.shape[0]
        return fn(q.a_q.contiguous(), q.w_q.contiguous().t(), q.s_a.contiguous().view(m, 1),
                  q.s_w.contiguous().view(n, 1), torch.bfloat16)

    return run


def runner(name: str, fmt: str, device: torch.device) -> tuple[Runner | None, str]:
    """(the arm's callable, why) for ``name`` on ``fmt`` operands; callable None when it cannot run here."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None, "not run: no GPU"
    if fmt == "int8":
        from ..kernels.registry import get

        arm = get(name, device)
        ok, why = arm.available()
        if not ok:
            return None, why
        return (lambda q: arm.scaled_mm(q.a_q, q.w_q, q.s_a, q.s_w)), why
    if name in ("torch-scaled-mm", "triton-fp8"):
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            return None, f"{name} with e4m3 needs compute capability >= 8.9, found {major}.{minor}"
        if name == "torch-scaled-mm":
            return _scaled_mm, "torch._scaled_mm (cuBLASLt, row-wise scales)"
        try:
            from .triton_fp8 import scaled_mm_fp8
        except ImportError as exc:
            return None, f"Triton is not importable: {exc}"
        return (lambda q: scaled_mm_fp8(q.a_q, q.w_q, q.s_a, q.s_w)), "the project's Triton FP8 kernel"
    if name in ("vllm-cutlass", "vllm-triton"):
        from ..kernels.vllm_arms import VllmArm

        kernel = name.split("-", 1)[1]
        ok, why = VllmArm(kernel, device).available()  # type: ignore[arg-type]
        if not ok:
            return None, "not run: vLLM absent" if "not installed" in why else why
        return _vllm(kernel), why
    raise InputError(f"ksweep: arm {name!r} does not take {fmt} operands")


def library_evidence() -> dict[str, str]:
    """Versions, and the vLLM op library's and Triton kernel source's paths and SHA-256 where present."""
    facts = {"torch": torch.__version__, "triton": package_version("triton"), "vllm": package_version("vllm"),
             "cuda": str(torch.version.cuda), "cublas_lt": "bundled with torch (torch.version.cuda above)"}
    spec = importlib.util.find_spec("vllm") if facts["vllm"] != "absent" else None
    if spec is not None and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        for key, rel in (("vllm_op_library", VLLM_LIBRARY),
                         ("vllm_triton_source",
                          "model_executor/layers/quantization/compressed_tensors/triton_scaled_mm.py")):
            path = root / rel
            facts[key] = path.as_posix()
            facts[f"{key}_sha256"] = sha256_file(path) if path.is_file() else "absent"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts["device"] = props.name
        facts["compute_capability"] = f"sm_{props.major}{props.minor}"
    else:
        facts["device"] = "cpu (no GPU)"
    return facts


def kernel_names(run: Runner, q: Quantized) -> str:
    """The CUDA kernels one call launches, as the profiler names them ('; '-joined), or why not."""
    try:
        from torch.profiler import ProfilerActivity, profile

        run(q)  # compile and warm up outside the trace
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(q)
            torch.cuda.synchronize()
        names = sorted({e.key for e in prof.key_averages() if getattr(e, "device_type", None) is not None
                        and str(e.device_type).endswith("CUDA")})
        return "; ".join(names) if names else "not obtainable: the profiler saw no CUDA kernel"
    except Exception as exc:  # the profiler's failures are many kinds; the sweep does not depend on it
        return f"not obtainable: {type(exc).__name__}: {exc}"


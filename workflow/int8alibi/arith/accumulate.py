"""The exact int8 GEMM accumulator (the reference every kernel is checked against), and int32 wrap.

Products of int8 values are integers of magnitude <= 2**14, so a float64 sum of at most
2**53 / 2**14 = 2**39 of them is an integer below 2**53 at every step: exact in any summation
order, on any BLAS. Deeper reductions are cut into such chunks, each converted to int64 and summed
in int64 (CUDA has no int64 matmul). Exact sums are the same integers on any library, so the CPU
takes the fastest exact route it can prove (``_OneDnnInt8``, ``_NumpyBlas``).
"""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from threadpoolctl import ThreadpoolController

from ..errors import InputError
from .bounds import F32_EXACT_BOUND, F64_EXACT_BOUND, INT8_PRODUCT_MAX, INT32_LIMIT

AccumulatorPath = Literal["auto", "fp64", "int64", "fp32"]

FP64_EXACT_DEPTH = F64_EXACT_BOUND // INT8_PRODUCT_MAX  # 2**39: the deepest exact float64 reduction
FP32_EXACT_DEPTH = F32_EXACT_BOUND // INT8_PRODUCT_MAX  # 2**10: the deepest exact float32 reduction


def _check_operands(a_q: torch.Tensor, w_q: torch.Tensor) -> None:
    for name, t in (("a_q", a_q), ("w_q", w_q)):
        if t.dtype != torch.int8 or t.dim() != 2:
            raise InputError(f"exact_accumulator: {name} must be a 2-D int8 tensor, got {t.dtype} {tuple(t.shape)}")
    if a_q.shape[1] != w_q.shape[1]:
        raise InputError(f"exact_accumulator: reduction depths differ (a_q K={a_q.shape[1]}, w_q K={w_q.shape[1]})")
    if a_q.device != w_q.device:
        raise InputError(f"exact_accumulator: a_q on {a_q.device}, w_q on {w_q.device}")


class _WideWeights:
    """float64 / float32 copies of recently used int8 weight tensors, transposed: ``w_q.T`` [K, N]
    contiguous, the layout OpenBLAS reads fastest at small M (a quarter less time at M = 1).

    A model's weights are reused on every forward (decode steps call each layer once per token),
    and widening int8 to float64 costs more than the matmul itself at M=1. Entries are keyed by the
    tensor object and its in-place version counter, held weakly, and bounded in bytes (LRU).
    """

    def __init__(self, max_bytes: int = 2 << 30) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, torch.dtype], tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = (
            OrderedDict())
        self._bytes = 0

    def get(self, w_q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if w_q.is_inference():  # made under inference mode: no version counter to key on, so not kept
            return w_q.T.to(dtype).contiguous()
        key = (id(w_q), dtype)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is w_q and entry[1] == w_q._version:
            self._entries.move_to_end(key)
            return entry[2]
        if entry is not None:
            self._drop(key)
        wide = w_q.T.to(dtype).contiguous()
        size = wide.numel() * wide.element_size()
        if size <= self.max_bytes:
            def forget(_: object, k: tuple[int, torch.dtype] = key) -> None:
                self._drop(k)

            self._entries[key] = (weakref.ref(w_q, forget), w_q._version, wide)
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
        return wide

    def _drop(self, key: tuple[int, torch.dtype]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry[2].numel() * entry[2].element_size()


_WEIGHTS = _WideWeights()


class _NumpyBlas:
    """numpy's bundled OpenBLAS, held to torch's intra-op thread count.

    The chunk products here are exact, so any BLAS gives the same integers in any order; torch's
    CPU GEMM runs on MKL's reproducible branch (``int8alibi.portable``), which float sums need and
    exact ones do not, and is two to three times slower there. OpenBLAS would otherwise start one
    thread per core in every process, and side-by-side jobs would fight over the cores.
    """

    def __init__(self, controller: ThreadpoolController) -> None:
        self.controller = controller  # threadpoolctl's handle on numpy's OpenBLAS alone
        self._threads = 0

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        threads = torch.get_num_threads()
        if threads != self._threads:
            self.controller.limit(limits=threads)
            self._threads = threads
        return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))


@functools.cache
def _numpy_blas() -> _NumpyBlas | None:
    """numpy's OpenBLAS (the wheels' scipy-openblas), or None where numpy was built otherwise.

    Chosen by folder, not only by kind: SciPy's wheels load an OpenBLAS of their own, which this
    module neither uses nor limits."""
    bundled = (Path(np.__file__).parent.parent / "numpy.libs").resolve()
    openblas = ThreadpoolController().select(internal_api="openblas")
    paths = [info["filepath"] for info in openblas.info() if Path(info["filepath"]).resolve().parent == bundled]
    return _NumpyBlas(openblas.select(filepath=paths)) if paths else None


# torch's CPU probes for int8 dot-product instructions, the ones oneDNN's fast int8 GEMM needs.
INT8_DOT_FEATURES = ("avx512_vnni", "avx_vnni", "amx_int8")


@functools.cache
def _int8_dot_products() -> bool:
    """Whether torch's probe of this CPU (``torch.cpu.get_capabilities``) reports any of
    ``INT8_DOT_FEATURES``; False where torch has no probe."""
    probe = getattr(torch.cpu, "get_capabilities", None)
    found = probe() if probe is not None else {}
    return any(bool(found.get(name, False)) for name in INT8_DOT_FEATURES)


class _OneDnnInt8:
    """oneDNN's int8 GEMM (``torch._int_mm`` with oneDNN switched on for that call alone), used for
    a shape only on a CPU with int8 dot products (``_int8_dot_products``) and only once it gave the
    exact sums on extreme and on random operands of that shape.

    Where the CPU has VNNI its int32 sums are exact and about ten times faster than any float
    route. Without VNNI it is no route to take: held to AVX2 on a VNNI host oneDNN adds u8·s8
    product pairs in int16 with saturation (measured wrong on random operands), and on an
    AVX2-only host its exact sums took 789 ms where numpy's OpenBLAS float32 took 25 ms
    (1200×1536×576, one thread). The extreme operands expose any saturating kernel: all-127
    activations (oneDNN's u8 255) against all-127 or all-(-128) weights make every pair, partial
    and final sum as large as int8 allows, so a kernel that saturates or wraps anywhere fails
    them. oneDNN stays off for every other operation (``int8alibi.portable``).
    """

    def __init__(self) -> None:
        self._exact: dict[tuple[int, int, int], bool] = {}

    def product(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        """The exact int32 ``a_q @ w_q.T``, or None where this CPU or this shape is not proven here."""
        if not _int8_dot_products():
            return None
        shape = (a_q.shape[0], w_q.shape[0], a_q.shape[1])
        if shape not in self._exact:
            self._exact[shape] = self._proven(*shape)
        return self._int_mm(a_q, w_q) if self._exact[shape] else None

    @staticmethod
    def _int_mm(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
        before = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(True)
        try:
            return torch._int_mm(a_q.contiguous(), w_q.T)
        finally:
            torch._C._set_mkldnn_enabled(before)

    def _proven(self, m: int, n: int, k: int) -> bool:
        if m == 0 or n == 0 or k == 0 or INT8_PRODUCT_MAX * k >= INT32_LIMIT:
            return False
        gen = torch.Generator().manual_seed(m * 1_000_003 + n * 1_009 + k)
        cases = [(torch.full((m, k), a_value, dtype=torch.int8), torch.full((n, k), w_value, dtype=torch.int8))
                 for a_value, w_value in ((127, 127), (127, -128), (-128, 127), (-128, -128))]
        cases.append((torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8),
                       torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)))
        for a, w in cases:
            try:
                got = self._int_mm(a, w)
            except RuntimeError:  # a torch built without oneDNN, or a shape its CPU kernel refuses
                return False
            # float64 sums of int8 products are exact at every depth int32 allows (2**31 < 2**53)
            if not torch.equal(got.to(torch.int64), _exact_matmul(a.double(), w.double().T).to(torch.int64)):
                return False
        return True


_ONEDNN = _OneDnnInt8()


def _exact_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for integer-valued floats whose every partial sum is exactly representable: on the
    CPU through numpy's OpenBLAS where there is one (``_NumpyBlas``), elsewhere torch's."""
    blas = _numpy_blas() if a.device.type == "cpu" else None
    return a @ b if blas is None else blas.matmul(a, b)


def _chunked_product(a_q: torch.Tensor, w_q: torch.Tensor, dtype: torch.dtype, chunk: int) -> torch.Tensor:
    """Sum of exact per-chunk matmuls in ``dtype`` (each chunk's partial sums stay exactly
    representable: K-chunk * 2**14 <= 2**24 for float32, <= 2**53 for float64), summed in int64."""
    a_wide, w_t = a_q.to(dtype), _WEIGHTS.get(w_q, dtype)
    k = a_q.shape[1]
    if k <= chunk:
        return _exact_matmul(a_wide, w_t).to(torch.int64)
    acc = torch.zeros(a_q.shape[0], w_q.shape[0], dtype=torch.int64, device=a_q.device)
    for start in range(0, k, chunk):
        acc += _exact_matmul(a_wide[:, start:start + chunk], w_t[start:start + chunk]).to(torch.int64)
    return acc


def _fp32_exact_here(device: torch.device) -> bool:
    """float32 matmuls are IEEE float32 (no TF32/bf16 shortcuts): CPU at 'highest' precision."""
    return device.type == "cpu" and torch.get_float32_matmul_precision() == "highest"


def exact_accumulator(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    *,
    path: AccumulatorPath = "auto",
    chunk: int = FP64_EXACT_DEPTH,
) -> torch.Tensor:
    """``a_q[M,K] · w_q[N,K]ᵀ`` as exact int64 [M,N], on the operands' device.

    ``auto`` takes, on the CPU, oneDNN's int32 sums where proven exact for the shape
    (``_OneDnnInt8``), else float32 matmuls over K-chunks of at most 2**10 (each exact, the chunks
    summed in int64: two to three times faster than float64 there); elsewhere one float64 matmul
    while K*16384 <= 2**53 and the chunked int64 path beyond. ``int64`` forces the chunked float64
    path with ``chunk`` columns per matmul (at most 2**39), ``fp32`` the float32 one, so every path
    can be checked against the others at depths where they apply.
    """
    _check_operands(a_q, w_q)
    k = a_q.shape[1]
    if path not in ("auto", "fp64", "int64", "fp32"):
        raise InputError(f"exact_accumulator: unknown path {path!r} (expected auto, fp64, int64 or fp32)")
    if not 1 <= chunk <= FP64_EXACT_DEPTH:
        raise InputError(f"exact_accumulator: chunk={chunk} outside [1, {FP64_EXACT_DEPTH}] (float64 exactness)")
    if path == "fp64" and k > FP64_EXACT_DEPTH:
        raise InputError(f"exact_accumulator: K={k} too deep for one exact float64 matmul (max {FP64_EXACT_DEPTH})")
    if path == "auto" and a_q.device.type == "cpu":
        exact = _ONEDNN.product(a_q, w_q)
        if exact is not None:
            return exact.to(torch.int64)
    return _float_route(a_q, w_q, path, chunk)


def _float_route(a_q: torch.Tensor, w_q: torch.Tensor, path: AccumulatorPath, chunk: int) -> torch.Tensor:
    """The exact sums through float matmuls (``exact_accumulator``'s paths, checked there)."""
    if path == "fp32" or (path == "auto" and _fp32_exact_here(a_q.device)):
        return _chunked_product(a_q, w_q, torch.float32, FP32_EXACT_DEPTH)
    if path == "fp64" or (path == "auto" and a_q.shape[1] <= FP64_EXACT_DEPTH):
        return _chunked_product(a_q, w_q, torch.float64, FP64_EXACT_DEPTH)
    return _chunked_product(a_q, w_q, torch.float64, chunk)


def exact_int32(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """``exact_accumulator`` as int32, at depths where no int8 sum can leave int32 (16384·K < 2**31);
    on the CPU oneDNN's int32 sums themselves where they are proven exact (``_OneDnnInt8``)."""
    _check_operands(a_q, w_q)
    if INT8_PRODUCT_MAX * a_q.shape[1] >= INT32_LIMIT:
        raise InputError(f"exact_int32: K={a_q.shape[1]} is too deep for every int8 sum to fit int32")
    exact = _ONEDNN.product(a_q, w_q) if a_q.device.type == "cpu" else None
    return exact if exact is not None else _float_route(a_q, w_q, "auto", FP64_EXACT_DEPTH).to(torch.int32)


def wrap_int32(acc: torch.Tensor, *, bound: int | None = None) -> torch.Tensor:
    """The int32 a kernel's accumulator holds for the exact sum ``acc``: two's-complement wrap.

    ``bound``: a bound on |acc| the caller already knows (the measured largest magnitude, or
    16384 * K for int8 operands of depth K). Within int32 the wrap is the identity, and one
    conversion pass says so instead of the wrap's several.
    """
    if acc.dtype != torch.int64:
        raise InputError(f"wrap_int32: accumulator dtype {acc.dtype} is not torch.int64")
    if bound is not None and bound < 0:
        raise InputError(f"wrap_int32: bound {bound} on |acc| is negative")
    if bound is not None and bound < INT32_LIMIT:
        return acc.to(torch.int32)
    low = acc & 0xFFFFFFFF
    return torch.where(low >= INT32_LIMIT, low - 2 * INT32_LIMIT, low).to(torch.int32)

"""The project's own Triton INT8 GEMM: int32 tensor-core accumulation, Triton-order epilogue fused.

The epilogue is vLLM's Triton order, ``bf16_rne(s_w · (s_a · f32(acc)))`` in float32. The final
rounding to bf16 is done on the float32 bits with integer operations instead of
``x.to(tl.bfloat16)``: on a GPU that cast rounds to nearest even, but under ``TRITON_INTERPRET=1``
it truncates, and the kernel must be the same arithmetic in both places (the GPU run is the
authority; the interpreter only lets CPU tests see the same bits). The bf16 bits are stored as
int16 and viewed as bfloat16.

Tile sizes come from a fixed table keyed by M (no run-time autotuning), so a given shape always
runs the same program.

Beyond the alibi's precondition (16256·K >= 2**31) the interpreter and the GPU part ways again:
numpy's int32 matmul wraps, while the GPU's int8 tensor-core instructions saturate at every
accumulation step (measured on an H200 by ``validate_gpu``). Tests on CPU stay inside the
precondition.

Import this module only where Triton is installed; ``TRITON_INTERPRET`` is read when the kernel
is defined, i.e. at import.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton import knobs

from .base import OperandCheckCache, arm_evidence, as_device, check_device, check_multiple, check_operands, check_pair


@dataclass(frozen=True)
class TileConfig:
    """One launch configuration of the kernel."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


# (largest M served, config): the first row whose bound is >= M. Picked from SWEEP_CONFIGS by
# timing every candidate on an H200 (CUDA-graph replay) at the four Qwen3-1.7B layer shapes with
# ``int8alibi bench kernels --sweep-triton --m 1 16 512 4096``: the fastest config for M <= 16, the
# one with the best worst-case ratio to torch._int_mm over the four shapes at M = 512, and the
# fastest at M = 4096. Every timed config's output was equal bit for bit to the emulation.
TILE_TABLE: tuple[tuple[int, TileConfig], ...] = (
    (16, TileConfig(16, 64, 256, 1, 4, 4)),
    (1024, TileConfig(64, 64, 128, 8, 4, 4)),
    (2**31, TileConfig(128, 128, 128, 8, 8, 3)),
)

# Candidates the sweep times (``bench kernels --sweep-triton``); the table above is picked from them.
SWEEP_CONFIGS: tuple[TileConfig, ...] = (
    TileConfig(16, 64, 256, 1, 4, 4),
    TileConfig(16, 128, 128, 1, 4, 4),
    TileConfig(32, 64, 256, 1, 4, 4),
    TileConfig(64, 64, 128, 8, 4, 4),
    TileConfig(64, 128, 128, 8, 4, 4),
    TileConfig(64, 128, 256, 8, 4, 3),
    TileConfig(128, 64, 128, 8, 4, 4),
    TileConfig(128, 128, 64, 8, 4, 4),
    TileConfig(128, 128, 128, 8, 8, 3),
    TileConfig(128, 128, 128, 8, 4, 4),
    TileConfig(128, 256, 128, 8, 8, 3),
    TileConfig(64, 64, 256, 8, 4, 4),
    TileConfig(64, 256, 128, 8, 8, 3),
    TileConfig(128, 64, 256, 8, 4, 3),
    TileConfig(128, 128, 256, 8, 8, 3),
)


def config_for(m: int) -> TileConfig:
    """The table's launch configuration for ``m`` activation rows (the last row takes any larger M)."""
    for bound, config in TILE_TABLE[:-1]:
        if m <= bound:
            return config
    return TILE_TABLE[-1][1]


@triton.jit
def _bf16_rne_bits(y):
    """float32 -> bf16 bits, round to nearest even, as int16; NaN keeps sign and payload, gets quiet."""
    bits = y.to(tl.int32, bitcast=True)
    lsb = (bits >> 16) & 1
    rounded = (bits + 0x7FFF + lsb) >> 16  # carries into the exponent give the next binade or inf
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    quiet_nan = (bits >> 16) | 0x40
    return tl.where(is_nan, quiet_nan, rounded).to(tl.int16)


@triton.jit
def _w8a8_kernel(
    a_ptr, w_ptr, sa_ptr, sw_ptr, out_ptr,
    M, N, K,
    stride_am, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, EPILOGUE: tl.constexpr,
):
    # Grouped program order: GROUP_M row tiles share each weight column tile while it is in L2.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Out-of-range rows/columns load a valid row instead (wrapped index) and are never stored.
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + cols[None, :] * stride_wn + offs_k[:, None]  # [BLOCK_K, BLOCK_N], K-major

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        else:
            in_k = offs_k < K - k0
            a = tl.load(a_ptrs, mask=in_k[None, :], other=0)
            w = tl.load(w_ptrs, mask=in_k[:, None], other=0)
        acc = tl.dot(a, w, acc, out_dtype=tl.int32)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    in_out = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if EPILOGUE:
        s_a = tl.load(sa_ptr + rows)
        s_w = tl.load(sw_ptr + cols)
        y = s_w[None, :] * (s_a[:, None] * acc.to(tl.float32))
        tl.store(out_ptrs, _bf16_rne_bits(y), mask=in_out)
    else:
        tl.store(out_ptrs, acc, mask=in_out)


@triton.jit
def _cutlass_epilogue_kernel(acc_ptr, sa_ptr, sw_ptr, out_ptr, M, N, stride_am, stride_om,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The CUTLASS-order epilogue over an int32 accumulator: ``bf16_rne(s_a · (s_w · f32(acc)))``."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    rows = offs_m.to(tl.int64)
    acc = tl.load(acc_ptr + rows[:, None] * stride_am + offs_n[None, :], mask=inside, other=0)
    s_a = tl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)
    s_w = tl.load(sw_ptr + offs_n, mask=offs_n < N, other=0.0)
    y = s_a[:, None] * (s_w[None, :] * acc.to(tl.float32))
    tl.store(out_ptr + rows[:, None] * stride_om + offs_n[None, :], _bf16_rne_bits(y), mask=inside)


EPILOGUE_BLOCK = (32, 128)


def interpreted() -> bool:
    """Whether the kernel was defined under ``TRITON_INTERPRET=1`` (runs on CPU tensors in numpy)."""
    return type(_w8a8_kernel).__name__ == "InterpretedFunction"


class _Compiled:
    """One compiled kernel and grid, launched through Triton's own launcher (``CompiledKernel.run``)
    with the arguments as given: what ``compiled[grid](*args)`` does, without building a runner
    and looking the device and stream up through Triton's driver on every call."""

    __slots__ = ("kernel", "grid")

    def __init__(self, kernel: Any, grid: tuple[int, int, int]) -> None:
        kernel._init_handles()  # loaded by the first launch already; makes ``function`` safe to read
        self.kernel, self.grid = kernel, grid

    def __call__(self, *args: object) -> None:
        k, grid = self.kernel, self.grid
        stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
        k.run(grid[0], grid[1], grid[2], stream, k.function, k.packed_metadata, k.launch_metadata(grid, stream, *args),
              knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)


class _Launchers:
    """Compiled kernels by everything their compilation was specialised on, launched directly.

    ``kernel[grid](...)`` binds and specialises the arguments in Python on every call (tens of
    microseconds, more than the kernel at decode sizes). The compiled kernel it returns serves any
    later call whose shapes, strides, constexprs and pointer alignments are the same, so such a
    call launches it directly. Under the interpreter nothing is compiled and nothing is cached.
    """

    def __init__(self) -> None:
        self._compiled: dict[tuple[object, ...], _Compiled] = {}

    def launch(self, kernel: object, grid: tuple[int, ...], args: tuple[object, ...],
               **options: object) -> _Compiled | None:
        """Launch ``kernel`` once; return its direct launcher for later calls with arguments of the
        same specialisation (None under the interpreter)."""
        grid = (*grid, *(1,) * (3 - len(grid)))  # a compiled kernel's launcher takes all three
        key = (id(kernel), grid, tuple(_specialisation(a) for a in args), tuple(options.items()))
        direct = self._compiled.get(key)
        if direct is not None:
            direct(*args)
            return direct
        compiled = kernel[grid](*args, **options)  # type: ignore[index]
        if compiled is None or interpreted() or not hasattr(compiled, "_init_handles"):
            return None
        direct = self._compiled[key] = _Compiled(compiled, grid)  # type: ignore[arg-type]
        return direct


def _specialisation(arg: object) -> object:
    """What Triton may specialise a kernel on: a tensor's dtype, device and 16-byte alignment;
    any other argument's value."""
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.device, arg.data_ptr() % 16 == 0)
    return arg


LAUNCHERS = _Launchers()


def _cutlass_epilogue_args(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
                           ) -> tuple[torch.Tensor, tuple[int, int], tuple[object, ...]]:
    m, n = acc.shape
    out = torch.empty((m, n), dtype=torch.int16, device=acc.device)
    grid = (triton.cdiv(m, EPILOGUE_BLOCK[0]), triton.cdiv(n, EPILOGUE_BLOCK[1]))
    return out, grid, (acc, s_a, s_w, out, m, n, acc.stride(0), out.stride(0), *EPILOGUE_BLOCK)


def cutlass_epilogue(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """``kernels.exact.epilogue(acc, s_a, s_w, "cutlass")`` as one Triton kernel (one read of the
    accumulator): the same two float32 multiplies in the same order and the same bf16 rounding on
    integer bits. The caller checks shapes, dtypes and devices."""
    out, grid, args = _cutlass_epilogue_args(acc, s_a, s_w)
    LAUNCHERS.launch(_cutlass_epilogue_kernel, grid, args)
    return out.view(torch.bfloat16)


class CutlassEpiloguePlan:
    """``cutlass_epilogue`` for one operand set (M, N, the scales' storage): the grid and the
    compiled kernel found on the first call, so a later call allocates the output and launches."""

    def __init__(self) -> None:
        self._direct: _Compiled | None = None

    def __call__(self, acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        direct = self._direct
        if direct is None or acc.data_ptr() % 16:
            out, grid, args = _cutlass_epilogue_args(acc, s_a, s_w)
            self._direct = LAUNCHERS.launch(_cutlass_epilogue_kernel, grid, args)
            return out.view(torch.bfloat16)
        m, n = acc.shape
        out = torch.empty((m, n), dtype=torch.int16, device=acc.device)
        direct(acc, s_a, s_w, out, m, n, acc.stride(0), n, *EPILOGUE_BLOCK)
        return out.view(torch.bfloat16)


def _launch_args(
    a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor | None, s_w: torch.Tensor | None, cfg: TileConfig,
) -> tuple[torch.Tensor, tuple[int], tuple[object, ...]]:
    m, k = a_q.shape
    n = w_q.shape[0]
    epilogue = s_a is not None
    out = torch.empty((m, n), dtype=torch.int16 if epilogue else torch.int32, device=a_q.device)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    args = (a_q, w_q, s_a if epilogue else a_q, s_w if epilogue else a_q, out,
            m, n, k, a_q.stride(0), w_q.stride(0), out.stride(0),
            cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m, k % cfg.block_k == 0, epilogue)
    return out, grid, args


def _launch(
    a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor | None, s_w: torch.Tensor | None,
    config: TileConfig | None,
) -> torch.Tensor:
    cfg = config or config_for(a_q.shape[0])
    epilogue = s_a is not None
    out, grid, args = _launch_args(a_q.contiguous(), w_q.contiguous(),
                                   s_a.contiguous() if s_a is not None else None,
                                   s_w.contiguous() if epilogue else None, cfg)  # type: ignore[union-attr]  # both scales or neither
    LAUNCHERS.launch(_w8a8_kernel, grid, args, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out.view(torch.bfloat16) if epilogue else out


class _Plan:
    """The launch of one operand set (validated once; same storage, shapes, strides, dtypes): the
    compiled kernel, grid and integer arguments found on the first call, reused on later calls.
    Holds no tensor. Operands that are not contiguous take ``_launch`` every time."""

    def __init__(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor | None, s_w: torch.Tensor | None,
                 config: TileConfig | None) -> None:
        self.cfg = config or config_for(a_q.shape[0])
        self.fast = all(t is None or t.is_contiguous() for t in (a_q, w_q, s_a, s_w))
        self.direct: _Compiled | None = None
        self.shape = (a_q.shape[0], w_q.shape[0])
        self.dtype = torch.int16 if s_a is not None else torch.int32
        self.ints: tuple[object, ...] = ()

    def __call__(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor | None,
                 s_w: torch.Tensor | None) -> torch.Tensor:
        epilogue = s_a is not None
        if not self.fast:
            return _launch(a_q, w_q, s_a, s_w, self.cfg)
        direct = self.direct
        if direct is None:  # the first call: compile (or find) the kernel and keep what a launch needs
            cfg = self.cfg
            out, grid, args = _launch_args(a_q, w_q, s_a, s_w, cfg)
            self.direct = LAUNCHERS.launch(_w8a8_kernel, grid, args, num_warps=cfg.num_warps,
                                            num_stages=cfg.num_stages)
            self.ints = args[5:]
        else:
            out = torch.empty(self.shape, dtype=self.dtype, device=a_q.device)
            if epilogue:
                direct(a_q, w_q, s_a, s_w, out, *self.ints)
            else:
                direct(a_q, w_q, a_q, a_q, out, *self.ints)
        return out.view(torch.bfloat16) if epilogue else out


class TritonArm:
    """The project's Triton kernel (binary on a GPU; numpy interpreter on CPU, for tests only)."""

    name = "triton"
    is_emulation = False

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = as_device(device)
        self._plans = OperandCheckCache()

    def available(self) -> tuple[bool, str]:
        if self.device.type == "cuda":
            if interpreted():
                return False, "TRITON_INTERPRET=1 is set: the kernel would run in the interpreter, not on the GPU"
            if not torch.cuda.is_available():
                return False, "no CUDA GPU visible to torch"
            return True, f"Triton {triton.__version__} JIT on CUDA"
        if interpreted():
            return True, "TRITON_INTERPRET=1: Triton interpreter on CPU (tests only, not a GPU binary)"
        return False, "the Triton kernel runs on a CUDA device (on CPU only under TRITON_INTERPRET=1)"

    def _check(self, a_q: torch.Tensor, w_q: torch.Tensor) -> None:
        check_device(a_q, self.device, self.name)
        _, k, n = check_pair(a_q, w_q, self.name)
        check_multiple(k, 16, "K", self.name)
        check_multiple(n, 16, "N", self.name)

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor, config: TileConfig | None = None) -> torch.Tensor:
        def build() -> _Plan:
            self._check(a_q, w_q)
            return _Plan(a_q, w_q, None, None, config)

        return self._plans.plan((a_q, w_q), build, config)(a_q, w_q, None, None)

    def scaled_mm(
        self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
        config: TileConfig | None = None,
    ) -> torch.Tensor:
        def build() -> _Plan:
            check_operands(a_q, w_q, s_a, s_w, self.name)
            self._check(a_q, w_q)
            return _Plan(a_q, w_q, s_a, s_w, config)

        return self._plans.plan((a_q, w_q, s_a, s_w), build, config)(a_q, w_q, s_a, s_w)

    def evidence(self) -> dict[str, object]:
        return arm_evidence(
            self.name,
            "int8alibi.kernels.triton_arm._w8a8_kernel (Triton JIT: tl.dot int8 -> int32, fused float32 "
            "epilogue s_w*(s_a*f32(acc)), bf16 round-to-nearest-even on integer bits)",
            self.device,
            is_emulation=False,
            epilogue_order="triton",
            interpreter=interpreted(),
            tile_table=[{"max_m": bound, **asdict(cfg)} for bound, cfg in TILE_TABLE],
        )

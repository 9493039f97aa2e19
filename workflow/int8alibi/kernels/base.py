"""What every kernel arm is: one scaled INT8 GEMM interface, operand checks, and the evidence it records.

Two arms are compared on identical operands, so every arm validates those operands the same way
(dtypes, shapes, device) and records the same evidence fields for the manifests: which code ran,
which library versions, on which device, and whether it was an emulation rather than the binary.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch

from ..device import describe
from ..errors import InputError

T = TypeVar("T")
EMULATION_NOTE = "emulation: reproduces the arithmetic, not the binary"
BINARY_NOTE = "binary: the named library kernel itself ran"


@runtime_checkable
class Arm(Protocol):
    """A kernel arm: ``scaled_mm(a_q[M,K] i8, w_q[N,K] i8, s_a[M] f32, s_w[N] f32) -> [M,N] bf16``."""

    name: str
    is_emulation: bool
    device: torch.device

    def scaled_mm(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        """The layer output ``bf16(epilogue(a_q · w_qᵀ, s_a, s_w))``."""
        ...

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        """The int32 accumulator the arm computes, or None where the arm does not expose it."""
        ...

    def evidence(self) -> dict[str, object]:
        """What ran, for manifests: arm, implementation, versions, device, emulation flag."""
        ...

    def available(self) -> tuple[bool, str]:
        """Whether the arm can run on its device here, and why (not)."""
        ...


def package_version(dist: str) -> str:
    """Installed version of distribution ``dist`` without importing it, or ``absent``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def library_versions() -> dict[str, str]:
    """The versions that decide which kernel binaries exist: torch, triton, vllm."""
    return {"torch": torch.__version__, "triton": package_version("triton"), "vllm": package_version("vllm")}


def arm_evidence(
    name: str, implementation: str, device: torch.device, *, is_emulation: bool, **extra: object
) -> dict[str, object]:
    """The evidence record every arm returns; ``extra`` adds arm-specific facts (e.g. tile config)."""
    return {
        "arm": name,
        "implementation": implementation,
        "is_emulation": is_emulation,
        "note": EMULATION_NOTE if is_emulation else BINARY_NOTE,
        "versions": library_versions(),
        **describe(device),
        **extra,
    }


def as_device(device: torch.device | str | None) -> torch.device:
    """Normalize an arm's device: None means the CUDA GPU when one is present, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise InputError(f"kernel arm device {device} unsupported (expected cpu or cuda)")
    return device


def check_pair(a_q: torch.Tensor, w_q: torch.Tensor, who: str) -> tuple[int, int, int]:
    """(M, K, N) of int8 operands ``a_q[M,K]``, ``w_q[N,K]``; InputError naming ``who`` otherwise."""
    for label, t in (("a_q", a_q), ("w_q", w_q)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int8 or t.dim() != 2:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise InputError(f"{who}: {label} must be a 2-D torch.int8 tensor, got {got}")
    m, k = a_q.shape
    n, k_w = w_q.shape
    if k != k_w:
        raise InputError(f"{who}: reduction depths differ (a_q is [{m},{k}], w_q is [{n},{k_w}])")
    if a_q.device != w_q.device:
        raise InputError(f"{who}: a_q on {a_q.device} but w_q on {w_q.device}")
    return m, k, n


def check_operands(
    a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, who: str
) -> tuple[int, int, int]:
    """(M, K, N) of a full scaled-GEMM operand set; InputError naming ``who`` and the reason otherwise."""
    m, k, n = check_pair(a_q, w_q, who)
    for label, s, rows in (("s_a", s_a, m), ("s_w", s_w, n)):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or tuple(s.shape) != (rows,):
            got = f"{s.dtype} {tuple(s.shape)}" if isinstance(s, torch.Tensor) else type(s).__name__
            raise InputError(f"{who}: {label} must be torch.float32 of shape [{rows}], got {got}")
        if s.device != a_q.device:
            raise InputError(f"{who}: {label} on {s.device} but a_q on {a_q.device}")
    return m, k, n


def check_device(t: torch.Tensor, device: torch.device, who: str) -> None:
    """Operands must live where the arm's evidence says it runs, so the evidence cannot lie."""
    if t.device.type != device.type:
        raise InputError(f"{who}: operands are on {t.device} but this arm was selected for {device}")


class OperandCheckCache:
    """Remembers which operand sets an arm has validated, by their metadata alone.

    Every check an arm makes (dtype, rank, shapes, device, divisibility) reads only metadata, so an
    operand set seen before with the same storage, shape, strides, dtype and device passes again
    without the Python work: a stage calling one layer many times pays for validation once.
    """

    SIZE = 64

    def __init__(self) -> None:
        self._seen: dict[tuple[object, ...], Any] = {}

    @staticmethod
    def key(tensors: tuple[torch.Tensor, ...]) -> tuple[object, ...] | None:
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            return None
        return tuple((t.data_ptr(), t.shape, t.stride(), t.dtype, t.device) for t in tensors)

    def once(self, tensors: tuple[torch.Tensor, ...], check: Callable[[], None]) -> None:
        """Run ``check`` unless these operands passed it before (a failing check is never remembered)."""
        self.plan(tensors, check)

    def plan(self, tensors: tuple[torch.Tensor, ...], build: Callable[[], T], *extra: object) -> T:
        """What ``build`` (which validates first, then prepares) returned for these operands' metadata
        (and ``extra``), built on the first call: the launch work that depends on metadata alone
        (grid, strides, compiled kernel) is done once per operand set. A failing build is never
        remembered; unkeyable arguments are built every time."""
        key = self.key(tensors)
        if key is None:
            return build()
        key = (*key, *extra)
        if key in self._seen:
            return self._seen[key]
        made = build()
        if len(self._seen) >= self.SIZE:
            self._seen.pop(next(iter(self._seen)))
        self._seen[key] = made
        return made


def check_multiple(value: int, of: int, what: str, who: str) -> None:
    """A kernel's shape requirement (e.g. N % 16 == 0); InputError naming ``who`` when it fails."""
    if value % of:
        raise InputError(f"{who}: {what}={value} is not a multiple of {of}, which this kernel requires")

"""Arm names -> arms, and the choice of the two arms a run compares (``auto`` or an explicit pair).

Arms whose libraries are optional (Triton, vLLM) are built only when named, so importing the
registry never needs them. Every choice is returned with its evidence: what was chosen, why, and
what was not available and why, which manifests record.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence

import torch

from ..arm_names import ARM_NAMES
from ..errors import InputError
from .base import Arm, arm_evidence, as_device, check_operands
from .user_guard import DEFAULT_TIME_LIMIT_S, UserProcess, describe, serve

log = logging.getLogger("int8alibi")

# The exact emulation whose epilogue order each real kernel uses (what it must equal bit for bit).
EMULATION_OF: dict[str, str] = {
    "cublaslt": "exact-cutlass-order", "vllm-cutlass": "exact-cutlass-order",
    "triton": "exact-triton-order", "vllm-triton": "exact-triton-order",
}

# ``auto`` takes the first pair whose two arms are both available: the real kernels first.
AUTO_ORDER: tuple[tuple[str, str], ...] = (
    ("vllm-cutlass", "vllm-triton"),
    ("cublaslt", "triton"),
    ("exact-cutlass-order", "exact-triton-order"),
)


class UnavailableArm:
    """Stands for an arm whose module cannot even be imported here; ``available()`` says why."""

    is_emulation = False

    def __init__(self, name: str, device: torch.device, why: str) -> None:
        self.name, self.device, self._why = name, device, why

    def available(self) -> tuple[bool, str]:
        return False, self._why

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> None:
        raise InputError(f"{self.name}: unavailable ({self._why})")

    def scaled_mm(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        raise InputError(f"{self.name}: unavailable ({self._why})")

    def evidence(self) -> dict[str, object]:
        return arm_evidence(self.name, f"unavailable: {self._why}", self.device, is_emulation=False)


class UserArm:
    """A user's own ``scaled_mm(a_q, w_q, s_a, s_w) -> bf16`` function, named as ``module:function``.

    It runs in a worker process of its own behind ``user_guard`` (the module is imported there, each
    call gets copies of the operands that are checked afterwards, failures are named, a time limit is
    enforced by killing the worker): nothing the function does reaches the stage's process.
    """

    is_emulation = False

    def __init__(self, spec: str, device: torch.device, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> None:
        self.name, self.device, self.time_limit_s = spec, device, time_limit_s
        self._process = UserProcess(spec, time_limit_s)
        log.info("user arm %s: runs in worker process %d (%s)", spec, self._process.pid, self._process.source)

    def available(self) -> tuple[bool, str]:
        return True, f"user-supplied function {self.name} imported"

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> None:
        """A user function exposes only its output."""
        return None

    def scaled_mm(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        check_operands(a_q, w_q, s_a, s_w, self.name)
        return self._process.call((a_q, w_q, s_a, s_w))

    def evidence(self) -> dict[str, object]:
        return arm_evidence(
            self.name, f"user-supplied function {self.name} ({self._process.source})", self.device,
            is_emulation=False, user_supplied=True,
        )


def load_user_function(spec: str) -> Callable[..., object]:
    """The function a ``module:function`` arm names, imported (in the arm's worker process: ``user_guard``);
    ``InputError`` naming the arm and why it cannot be had."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # the user's module: any failure to import is named, KeyboardInterrupt too
        raise InputError(f"arm {spec!r}: cannot import module {module_name}: {describe(exc)}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise InputError(f"arm {spec!r}: {module_name} has no callable {attr}")
    return fn


def serve_user_arm(argv: list[str]) -> int:
    """The worker process of one user arm (``python -m int8alibi.kernels``; ``user_guard.serve``)."""
    return serve(load_user_function, argv)


def _user_arm(spec: str, device: torch.device, time_limit_s: float) -> UserArm:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InputError(f"arm {spec!r}: a user arm is named 'module:function'")
    return UserArm(spec, device, time_limit_s)


def get(name: str, device: torch.device | str | None = None, *,
        user_time_limit_s: float | None = None) -> Arm:
    """The arm called ``name`` for ``device`` (default: the GPU if present, else CPU); a user arm's
    calls are limited to ``user_time_limit_s`` each (default ``user_guard.DEFAULT_TIME_LIMIT_S``)."""
    dev = as_device(device)
    if name in ("exact-cutlass-order", "exact-triton-order"):
        from .exact import ExactArm

        return ExactArm("cutlass" if name == "exact-cutlass-order" else "triton", dev)
    if name == "cublaslt":
        from .cublaslt import CublasLtArm

        return CublasLtArm(dev)
    if name == "triton":
        try:
            from .triton_arm import TritonArm
        except ImportError as exc:
            return UnavailableArm(name, dev, f"Triton is not importable: {exc}")
        return TritonArm(dev)
    if name in ("vllm-cutlass", "vllm-triton"):
        from .vllm_arms import VllmArm

        return VllmArm("cutlass" if name == "vllm-cutlass" else "triton", dev)
    if ":" in name:
        return _user_arm(name, dev, DEFAULT_TIME_LIMIT_S if user_time_limit_s is None else user_time_limit_s)
    raise InputError(f"unknown kernel arm {name!r} (expected one of {', '.join(ARM_NAMES)} or module:function)")


def select(spec: str | Sequence[str], device: torch.device | str) -> tuple[Arm, Arm, dict[str, object]]:
    """Arms A and B for ``spec`` on ``device``, with the selection evidence manifests record.

    ``auto`` takes the first available pair of ``AUTO_ORDER``; an explicit pair must have both
    arms available, else InputError naming the arm and the reason (fail closed, no substitution).
    """
    dev = as_device(device)
    unavailable: dict[str, str] = {}
    if isinstance(spec, str):
        if spec != "auto":
            raise InputError(f"arms spec {spec!r}: expected 'auto' or a pair of arm names")
        pairs = AUTO_ORDER
        why = f"auto: first pair of {[list(p) for p in AUTO_ORDER]} whose arms are both available on {dev}"
    else:
        names = list(spec)
        if len(names) != 2:
            raise InputError(f"arms spec {names!r}: expected exactly two arm names")
        pairs = ((names[0], names[1]),)
        why = f"explicit pair {names} requested for {dev}"
    for pair in pairs:
        arms = [get(name, dev) for name in pair]
        reasons = {arm.name: arm.available() for arm in arms}
        missing = {name: reason for name, (ok, reason) in reasons.items() if not ok}
        if not missing:
            a, b = arms
            evidence: dict[str, object] = {
                "spec": spec if isinstance(spec, str) else list(spec),
                "device": str(dev),
                "chosen": [a.name, b.name],
                "why": why,
                "unavailable": unavailable,
                "emulation": a.is_emulation or b.is_emulation,
                "arms": [a.evidence(), b.evidence()],
            }
            return a, b, evidence
        unavailable.update(missing)
        if spec != "auto":
            detail = "; ".join(f"{name}: {reason}" for name, reason in missing.items())
            raise InputError(f"arms {list(pair)} on {dev}: not available ({detail})")
    detail = "; ".join(f"{name}: {reason}" for name, reason in unavailable.items())
    raise InputError(f"arms auto on {dev}: no pair available ({detail})")

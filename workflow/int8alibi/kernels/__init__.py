"""Kernel arms: one scaled INT8 GEMM interface, the exact emulations, cuBLASLt, Triton and vLLM arms.

``registry.get(name)`` builds one arm; ``registry.select(spec, device)`` picks the pair a run
compares and says why. Optional libraries (Triton, vLLM) are imported only when their arm is built.
"""

from .base import Arm
from .registry import ARM_NAMES, get, select

__all__ = ["ARM_NAMES", "Arm", "get", "select"]

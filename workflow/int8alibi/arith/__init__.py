"""Exact arithmetic: bf16 rounding, ulp distance, the exact accumulator, power-of-two scales, bounds.

Everything here decides on integers (bit fields, int64 sums), so the answers are the same on CPU
and GPU; the rest of the project compares kernels against these answers.
"""

from .accumulate import FP32_EXACT_DEPTH, FP64_EXACT_DEPTH, exact_accumulator, exact_int32, wrap_int32
from .bounds import (
    F32_EXACT_BOUND,
    F64_EXACT_BOUND,
    INT8_PRODUCT_MAX,
    INT32_LIMIT,
    INT32_PRODUCT_BOUND,
    f32_exact,
    int32_bound_holds,
)
from . import bf16
from .pow2 import is_pow2, snap_pow2
from .rounding import bf16_rne, bf16_round, bf16_rtz, has_nan
from .ulp import BF16Comparison, bf16_bits, compare_bf16, ordered_bf16, ulp_distance

__all__ = [
    "BF16Comparison",
    "F32_EXACT_BOUND",
    "F64_EXACT_BOUND",
    "FP32_EXACT_DEPTH",
    "FP64_EXACT_DEPTH",
    "INT32_LIMIT",
    "INT32_PRODUCT_BOUND",
    "INT8_PRODUCT_MAX",
    "bf16",
    "bf16_bits",
    "bf16_rne",
    "bf16_round",
    "bf16_rtz",
    "compare_bf16",
    "exact_accumulator",
    "exact_int32",
    "f32_exact",
    "has_nan",
    "int32_bound_holds",
    "is_pow2",
    "ordered_bf16",
    "snap_pow2",
    "ulp_distance",
    "wrap_int32",
]

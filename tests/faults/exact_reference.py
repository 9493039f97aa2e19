"""An independent, float64-exact reference for the epilogue faults, sharing no code with ``int8alibi``.

Every value handled here is a float32 or bf16 number, or an exact product of two float32 numbers,
and float64 holds each of them exactly (24 x 24 significand bits fit in 53; the exponents stay far
inside float64's range). Rounding to a narrower format is written out: the quantum of the value's
binade (never below the format's subnormal spacing) scales it to an exact float64 integer part and
fraction, and the tie rule is applied on that fraction by hand. No NaN is modelled: the NaN an
invalid operation creates is the executing hardware's default NaN, not a property of a fault, so
callers keep their operands free of inf * 0.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Mode = Literal["rne", "rtz"]
F32 = (24, -126, 127)   # significand bits (with the implicit one), least normal exponent, greatest exponent
BF16 = (8, -126, 127)


def round_to(x: np.ndarray, fmt: tuple[int, int, int], mode: Mode) -> np.ndarray:
    """``x`` (exact float64 values) rounded once to the format ``fmt``, as float64 values.

    ``rne``: nearest, ties to the even significand; overflow (at or beyond the largest finite value
    plus half a spacing) gives +-inf. ``rtz``: toward zero; beyond the largest finite value gives
    the largest finite value, and only an infinite input stays infinite. Signed zeros are kept.
    """
    p, emin, emax = fmt
    x = np.asarray(x, dtype=np.float64)
    if np.isnan(x).any():
        raise ValueError("the reference does not model NaN")
    mag = np.abs(x)
    finite = np.isfinite(mag)
    safe = np.where(finite, mag, 1.0)
    _, e = np.frexp(safe)                      # safe = m * 2**e, 0.5 <= m < 1 (e = 0 for zero)
    exponent = np.maximum(e - 1, emin)         # the binade's exponent; subnormals share emin's quantum
    quantum = np.ldexp(1.0, exponent - (p - 1))
    scaled = safe / quantum                    # exact: division by a power of two, result < 2**p
    whole = np.floor(scaled)
    frac = scaled - whole                      # exact
    if mode == "rne":
        up = (frac > 0.5) | ((frac == 0.5) & (np.fmod(whole, 2.0) == 1.0))
        rounded = (whole + up) * quantum
    elif mode == "rtz":
        rounded = whole * quantum
    else:
        raise ValueError(mode)
    largest = (2.0 - 2.0 ** (1 - p)) * 2.0 ** emax
    beyond = rounded > largest                 # only reachable by rounding up, or by a huge input
    if mode == "rne":
        rounded = np.where(beyond, np.inf, rounded)
    else:
        rounded = np.where(beyond, largest, rounded)
    rounded = np.where(finite, rounded, np.inf)
    return np.copysign(rounded, x)


def f32(x: np.ndarray) -> np.ndarray:
    """One IEEE float32 rounding (nearest even) of exact values: what a float32 operation returns."""
    return round_to(x, F32, "rne")


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns (int64 in [0, 0xFFFF]) of values that bf16 represents exactly."""
    x = np.asarray(x, dtype=np.float64)
    as32 = x.astype(np.float32)                # exact for bf16 values (a subset of float32)
    if not bool(((as32.astype(np.float64) == x) | np.isinf(x)).all()):
        raise ValueError("not bf16 values")
    bits = as32.view(np.uint32).astype(np.int64)
    if (bits & 0xFFFF).any():
        raise ValueError("not bf16 values: low float32 bits set")
    return bits >> 16


def scale(acc: np.ndarray, s_a: np.ndarray, s_w: np.ndarray) -> np.ndarray:
    """The reference scaling ``(f32(acc) * s_a) * s_w``, two float32 roundings, [M, N] from int accumulators."""
    acc32 = f32(np.asarray(acc, dtype=np.float64))
    return f32(f32(acc32 * np.asarray(s_a, np.float64)[:, None]) * np.asarray(s_w, np.float64)[None, :])


def reference(acc, s_a, s_w) -> np.ndarray:
    """Arm A: ``bf16_rne((f32(acc) * s_a) * s_w)`` as bits."""
    return bf16_bits(round_to(scale(acc, s_a, s_w), BF16, "rne"))


def f1(acc, s_a, s_w) -> np.ndarray:
    """F1: both scales rounded to bf16 (nearest even) first, then the reference order and rounding."""
    s_a16 = round_to(np.asarray(s_a, np.float64), BF16, "rne")
    s_w16 = round_to(np.asarray(s_w, np.float64), BF16, "rne")
    return bf16_bits(round_to(scale(acc, s_a16, s_w16), BF16, "rne"))


def f2(acc, s_a, s_w) -> np.ndarray:
    """F2: ``f32(acc) * s_a`` rounded to bf16, times ``s_w`` in float32, rounded to bf16 again."""
    acc32 = f32(np.asarray(acc, dtype=np.float64))
    partial = round_to(f32(acc32 * np.asarray(s_a, np.float64)[:, None]), BF16, "rne")
    return bf16_bits(round_to(f32(partial * np.asarray(s_w, np.float64)[None, :]), BF16, "rne"))


def f4(acc, s_a, s_w) -> np.ndarray:
    """F4: the reference scaling, then bf16 toward zero."""
    return bf16_bits(round_to(scale(acc, s_a, s_w), BF16, "rtz"))


def f4_scales_first(acc, s_a, s_w) -> np.ndarray:
    """NOT F4: ``f32(acc) * f32(s_a * s_w)`` toward zero (the wrong association), to show a test tells them apart."""
    acc32 = f32(np.asarray(acc, dtype=np.float64))
    both = f32(np.asarray(s_a, np.float64)[:, None] * np.asarray(s_w, np.float64)[None, :])
    return bf16_bits(round_to(f32(acc32 * both), BF16, "rtz"))

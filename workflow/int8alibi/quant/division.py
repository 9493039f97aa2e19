"""How far the pinned bf16 division is from a float32 one: the statistics arXiv:2609.00363 reports.

For one layer with its stored bf16 scale ``s_w`` [N,1] (the same under either division: the scale
is computed on its own, ``channel_scale``):

* ``q_f32 = f32(W) / f32(s_w)``, the float32 quotient; ``q_bf16 = bf16(q_f32)``, the pinned
  division's quotient (``weight.quotient``);
* ``differing``: int8 weights that differ between ``round_half_even(clamp(q_f32))`` and
  ``round_half_even(clamp(q_bf16))``, the share arXiv:2609.00363 reports for its float32 first
  attempt (6.42%), which its gate rejected;
* ``quotient_shift_max``: ``max |q_bf16 - q_f32|``, the bf16 rounding of the quotient alone (at
  most 0.25 while ``|q| < 128``, half of bf16's spacing 0.5 in [64, 128));
* ``code_offset_max``: ``max |int8_bf16 - clamp(q_f32, -128, 127)|``, how far the stored int8
  weight lies from the float32 quotient (below 0.75: 0.25 from the bf16 rounding plus 0.5 from
  the rounding to an integer). arXiv:2609.00363's "bf16 division moving quotients by up to
  0.749" exceeds the first bound, so it is this one. The bound holds for any weights, so a maximum
  over millions of weights lands just below 0.75 on any model: matching 0.749 is by construction,
  not evidence about the model.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import weight as wq


class DivisionStats(NamedTuple):
    """One layer's comparison of the two divisions (see the module docstring)."""

    differing: int
    quotient_shift_max: float
    code_offset_max: float


def division_stats(w: torch.Tensor, s_w: torch.Tensor, *, what: str = "weight") -> DivisionStats:
    """The float32-versus-bf16 division statistics of bf16 ``w`` [N,K] under bf16 scale ``s_w`` [N,1].

    One float32 quotient serves both divisions: the pinned one is that quotient rounded once to
    bf16 (``weight.quotient``'s definition), so nothing is divided twice."""
    wq.check_weight_and_scale(w, s_w, what)
    q_f32 = wq.quotient(w, s_w, "float32")
    q_bf16 = q_f32.to(torch.bfloat16).float()
    codes_bf16, codes_f32 = wq.codes(q_bf16), wq.codes(q_f32)
    return DivisionStats(
        differing=int((codes_bf16 != codes_f32).sum()),
        # both differences are exact in float32 (operands within a factor of two, Sterbenz)
        quotient_shift_max=float((q_bf16 - q_f32).abs().max()),
        code_offset_max=float((codes_bf16.float() - q_f32.clamp(wq.Q_MIN, wq.Q_MAX)).abs().max()),
    )

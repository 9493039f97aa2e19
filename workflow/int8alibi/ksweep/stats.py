"""How two bf16 outputs of one pair differ: prevalence, ulp histogram, the >= 2 ulp shares, relative size.

Distances are counted on ordered bf16 bit patterns (``arith.ulp``: both zeros at 0, neighbours
across zero one apart). A pair with an inf or NaN on either side has no distance: it is counted as
non-finite and kept out of every ulp and relative statistic, so it can never hide in a maximum.
Near-zero elements (|a| below a registered fraction of arm A's RMS) are counted apart: cancellation
makes their relative difference large whatever the accumulation depth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..arith.ulp import bf16_bits, ulp_distance
from ..errors import InputError


@dataclass(frozen=True)
class PairStats:
    """Counts and magnitudes of one comparison (Python numbers read back from the device)."""

    elements: int
    differing: int
    nonfinite_pairs: int
    signed_zero_pairs: int
    near_zero_threshold: float
    near_zero_elements: int
    differing_near_zero: int
    differing_non_near_zero: int
    ge2_ulp_non_near_zero: int
    max_ulp: int | None
    max_relative_difference: float | None
    median_relative_difference: float | None
    histogram: dict[str, list[int]]  # region -> counts per bin (bins from the protocol's lower edges)

    @property
    def prevalence(self) -> float:
        return self.differing / self.elements if self.elements else 0.0

    @property
    def ge2_ulp_share(self) -> float | None:
        """Share of differing non-near-zero elements at >= 2 ulp; None when none differ there."""
        if not self.differing_non_near_zero:
            return None
        return self.ge2_ulp_non_near_zero / self.differing_non_near_zero

    @property
    def ge2_ulp_share_of_all(self) -> float:
        """The same >= 2 ulp non-near-zero elements as a share of all outputs (arXiv:2608.13756 reports both)."""
        return self.ge2_ulp_non_near_zero / self.elements if self.elements else 0.0


def median(values: torch.Tensor) -> float | None:
    """The middle value of a 1-D tensor, the mean of the two middle ones for an even count; None if empty.

    torch.median returns the lower middle value for an even count, which is not the registered median.
    """
    n = values.numel()
    if not n:
        return None
    ordered = values.sort().values
    return float(((ordered[(n - 1) // 2] + ordered[n // 2]) / 2).item())


def bin_labels(edges: Sequence[int]) -> list[tuple[int, int | None]]:
    """(lower, upper inclusive or None for the open last bin) per bin of lower ``edges``."""
    if not edges or edges[0] != 1 or list(edges) != sorted(set(edges)):
        raise InputError(f"ulp bins: lower edges must ascend from 1 without repeats, got {list(edges)}")
    return [(lo, (edges[i + 1] - 1) if i + 1 < len(edges) else None) for i, lo in enumerate(edges)]


def compare(a: torch.Tensor, b: torch.Tensor, *, near_zero_fraction: float, edges: Sequence[int]) -> PairStats:
    """Compare arm A's output ``a`` with arm B's ``b`` (same-shaped bf16 tensors on one device)."""
    bins = bin_labels(edges)
    distance = ulp_distance(a, b)  # validates dtype, shape and device; -1 where either is not finite
    differ = bf16_bits(a) != bf16_bits(b)
    finite = distance >= 0
    a64, b64 = a.double(), b.double()
    finite_a = torch.isfinite(a64)
    count_a = int(finite_a.sum().item())
    rms = float(torch.sqrt((torch.where(finite_a, a64, 0.0) ** 2).sum() / count_a).item()) if count_a else 0.0
    threshold = near_zero_fraction * rms
    near = finite & ((a64.abs() < threshold) | (a64 == 0))  # an exact zero is near zero even if RMS is 0
    far = finite & ~near
    edge_t = torch.tensor(list(edges), dtype=distance.dtype, device=distance.device)
    histogram: dict[str, list[int]] = {}
    for region, mask in (("near_zero", near), ("non_near_zero", far)):
        picked = distance[mask & differ & (distance >= 1)]  # +0 vs -0 differ at distance 0: counted apart
        index = torch.bucketize(picked, edge_t, right=True) - 1
        histogram[region] = torch.bincount(index, minlength=len(bins)).tolist()
    diff_far = far & differ
    diff_finite = finite & differ
    rel = ((a64 - b64).abs() / a64.abs())[diff_far]
    n_far = rel.numel()
    return PairStats(
        elements=a.numel(),
        differing=int(differ.sum().item()),
        nonfinite_pairs=int((~finite).sum().item()),
        signed_zero_pairs=int((differ & finite & (distance == 0)).sum().item()),
        near_zero_threshold=threshold,
        near_zero_elements=int(near.sum().item()),
        differing_near_zero=int((near & differ).sum().item()),
        differing_non_near_zero=n_far,
        ge2_ulp_non_near_zero=int((diff_far & (distance >= 2)).sum().item()),
        max_ulp=int(distance[diff_finite].max().item()) if bool(diff_finite.any()) else None,
        max_relative_difference=float(rel.max().item()) if n_far else None,
        median_relative_difference=median(rel),
        histogram=histogram,
    )

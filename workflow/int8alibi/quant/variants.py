"""The checkpoint variants the requant stage builds from the parent, in the order every stage lists them.

``own`` is the unconstrained W8A8 rule (byte-identical to the reference checkpoint: requant's gate);
``pow2-nearest`` and ``pow2-ceiling`` snap each weight scale to a power of two and requantize under
it; ``probe`` snaps the scales and keeps own's int8 weights (the weight-scale mismatch). Planning
reads this list (the determinism rules' checkpoint wildcard), so the module imports nothing.
"""

from __future__ import annotations

CHECKPOINT_VARIANTS: tuple[str, ...] = ("own", "pow2-nearest", "pow2-ceiling", "probe")

"""The requantized checkpoint set and its gate: folder names, the gate table's schema and verdicts.

The requant stage writes ``<requant>/checkpoints/<name>/`` for every name in ``quant.variants.CHECKPOINT_VARIANTS``
beside ``gate.parquet``; every reader (capture, the engines) finds the checkpoints through this
layout and trusts them only under one of ``VERDICTS``. The reference stage's llm-compressor files,
which the gate compares against, lie in ``<reference>/checkpoint/``.
"""

from __future__ import annotations

import pyarrow as pa

CHECKPOINTS_DIR = "checkpoints"
GATE_TABLE = "gate.parquet"
GATE_PASSED = "passed: byte-identical to the committed checkpoint"
GATE_PASSED_TOOL = "passed: byte-identical to llm-compressor's own checkpoint"
GATE_SELF_BUILT = "self-built (not an independent test)"
VERDICTS: tuple[str, ...] = (GATE_PASSED, GATE_PASSED_TOOL, GATE_SELF_BUILT)

GATE_SCHEMA = pa.schema([
    pa.field("block", pa.int32(), nullable=False),
    pa.field("proj", pa.string(), nullable=False),
    pa.field("arm", pa.string(), nullable=False),
    pa.field("layer", pa.string(), nullable=False),
    pa.field("n", pa.int64(), nullable=False),
    pa.field("k", pa.int64(), nullable=False),
    pa.field("division", pa.string(), nullable=False),
    pa.field("reference", pa.string(), nullable=False),       # what bytes_equal compares against
    pa.field("bytes_equal", pa.bool_(), nullable=True),       # null: not applicable (self-built own)
    pa.field("differing_int8", pa.int64(), nullable=True),
    pa.field("differing_scales", pa.int64(), nullable=True),
    pa.field("scale_min", pa.float64(), nullable=False),
    pa.field("scale_max", pa.float64(), nullable=False),
    pa.field("scale_ratio", pa.float64(), nullable=False),    # max / min
    pa.field("clipped", pa.int64(), nullable=True),           # quotients outside [-128, 127]; null for probe
    pa.field("saturated", pa.int64(), nullable=False),        # int8 elements at -128 or 127
    pa.field("all_pow2", pa.bool_(), nullable=False),
    pa.field("gate", pa.string(), nullable=False),
    # quant.division, under this arm's scale; null for the probe, which divides nothing
    pa.field("f32_division_differing", pa.int64(), nullable=True),  # int8 weights a float32 division changes
    pa.field("quotient_shift_max", pa.float64(), nullable=True),     # max |q_bf16 - q_f32|
    pa.field("code_offset_max", pa.float64(), nullable=True),        # max |int8 - clamp(q_f32)|
])
GATE_KEY = ["block", "proj", "arm"]
REFERENCE_CHECKPOINT_DIR = "checkpoint"  # inside the reference stage folder: every file llm-compressor wrote

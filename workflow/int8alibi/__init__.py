"""int8alibi: is a scaled INT8 GEMM kernel interchangeable with another? Measured, pinned, verified."""

__version__ = "0.1.0"

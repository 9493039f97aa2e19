"""Quantization rules: vLLM's per-token activation rule, llm-compressor's channel-wise weight rule,
its power-of-two variants, the compressed-tensors checkpoint layout, and the requant gate with the
checkpoint arms it writes (``requant``)."""

"""Quantization rules: vLLM's per-token activation rule, llm-compressor's channel-wise weight rule,
its power-of-two variants, and the compressed-tensors checkpoint layout."""

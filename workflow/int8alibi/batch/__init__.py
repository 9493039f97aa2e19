"""Batch invariance: does a row's output depend on what it is batched with (``preregistration/batch.yaml``)?

``layer``: captured rows at every registered M and among strangers, per GEMM; ``sequence``: prompts
generated alone and inside left-padded batches; ``summary``: the tables set against the predictions.
"""

"""Models: parent sources (HF directory, GGUF package, synthetic), W8A8 linears, operand capture.

Submodules are imported where used, so importing the package never loads transformers.
"""

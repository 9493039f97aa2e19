"""The K sweep: INT8 versus FP8 kernel divergence against reduction depth (protocol: ksweep.yaml).

``operands`` draws and quantizes the seeded operands, ``arms`` runs each format's kernels,
``stats`` compares two bf16 outputs, ``fit`` compares the candidate models of prevalence
against K and tests the INT8 rate for constancy; ``sweep`` runs the grid and builds the tables the
ksweep stage writes.
"""

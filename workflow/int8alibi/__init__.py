"""int8alibi: is a scaled INT8 GEMM kernel interchangeable with another? Measured, pinned, verified."""

__version__ = "0.1.0"
# The environments (the locks, their installer, the conda files), relative to the checkout's root: in
# the workflow folder, where the Snakemake workflow catalog's layout keeps them.
ENVS = "workflow/envs"

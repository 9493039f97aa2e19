"""Run Snakemake with the heavy libraries made unimportable for the workflow's own code.

``python heavy_imports_blocked.py <snakemake arguments>``: an import of torch, pandas, numpy, pyarrow,
safetensors or transformers that the Snakefile or the int8alibi package makes fails, naming the file
and line that asked (Snakemake's own imports, e.g. of its SLURM plugin, are left alone). Used by
test_plain_snakemake to hold planning to the parse-time packages in every environment.
"""

from __future__ import annotations

import sys
import traceback

BLOCKED = {"torch", "pandas", "numpy", "pyarrow", "safetensors", "transformers"}


class _Blocker:
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0] in BLOCKED:
            ours = [f for f in traceback.extract_stack() if "/int8alibi/" in f.filename or f.filename.endswith(".smk")
                    or f.filename.endswith("Snakefile")]
            if ours:
                raise ImportError(f"{name} imported while planning, from {ours[-1].filename}:{ours[-1].lineno}")


if __name__ == "__main__":
    sys.meta_path.insert(0, _Blocker())
    sys.argv = ["snakemake", *sys.argv[1:]]
    from snakemake.cli import main

    main()

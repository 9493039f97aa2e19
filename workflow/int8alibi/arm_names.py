"""The registered kernel arms by name, and the check of an explicit pair, importable without torch.

Planning checks a config's ``arms`` with these (``resolve``); building an arm is
``kernels.registry``'s, which needs torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .errors import InputError

ARM_NAMES: tuple[str, ...] = (
    "exact-cutlass-order", "exact-triton-order", "cublaslt", "triton", "vllm-cutlass", "vllm-triton",
)
# The pair whose kernel vLLM's own engine chooses (engine: vllm); with the own engine the same two
# names call vLLM's kernel ops inside the project's W8A8 linears.
VLLM_PAIR: tuple[str, str] = ("vllm-cutlass", "vllm-triton")
# The shape of any arm name: a registered one, or ``module.sub:function`` of Python identifiers. Arm names
# become path parts (a generate job's output folder and log), so nothing else (``../``, ``/``, spaces) may
# pass; the config schema's ``arms`` items carry this same pattern (a test holds them equal). ``(?!\n)$``:
# jsonschema searches with Python's ``$``, which also matches before a final newline.
ARM_PATTERN = r"^([a-z0-9][a-z0-9-]*|[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*)(?!\n)$"
_ARM = re.compile(ARM_PATTERN)


def check_names(names: Sequence[str], source: str = "config: arms") -> None:
    """Refuse, before anything runs, an explicit pair that names one arm twice or an arm that is neither
    registered nor written ``module:function`` of Python identifiers (a user arm's module is not
    imported here; its name becomes a path part, so ``../x:f`` is refused)."""
    for name in names:
        if name not in ARM_NAMES and (":" not in name or not _ARM.fullmatch(name)):
            raise InputError(f"{source}: unknown kernel arm {name!r} (expected one of {', '.join(ARM_NAMES)} "
                             "or module:function)")
    if len(set(names)) != len(names):
        raise InputError(f"{source}: {list(names)} names the same arm twice; the comparison needs two arms")

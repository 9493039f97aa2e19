"""The registered kernel arms by name, and the check of an explicit pair, importable without torch.

Planning checks a config's ``arms`` with these (``resolve``); building an arm is
``kernels.registry``'s, which needs torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import InputError

ARM_NAMES: tuple[str, ...] = (
    "exact-cutlass-order", "exact-triton-order", "cublaslt", "triton", "vllm-cutlass", "vllm-triton",
)
# The pair whose kernel vLLM's own engine chooses (engine: vllm); with the own engine the same two
# names call vLLM's kernel ops inside the project's W8A8 linears.
VLLM_PAIR: tuple[str, str] = ("vllm-cutlass", "vllm-triton")


def check_names(names: Sequence[str], source: str = "config: arms") -> None:
    """Refuse, before anything runs, an explicit pair that names one arm twice or an arm that is neither
    registered nor written ``module:function`` (a user arm's module is not imported here)."""
    for name in names:
        module_name, colon, attr = name.partition(":")
        if name not in ARM_NAMES and not (colon and module_name and attr):
            raise InputError(f"{source}: unknown kernel arm {name!r} (expected one of {', '.join(ARM_NAMES)} "
                             "or module:function)")
    if len(set(names)) != len(names):
        raise InputError(f"{source}: {list(names)} names the same arm twice; the comparison needs two arms")

"""``int8alibi bench kernels|faults|dag``: dispatch to the benchmark named by the first argument.

Each benchmark module is imported only when asked for, so one benchmark's dependencies never
burden another.
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {"kernels": "int8alibi.bench.kernels", "faults": "int8alibi.bench.faults", "dag": "int8alibi.bench.dag"}


def main(argv: list[str] | None = None) -> int:
    """Run ``int8alibi bench <name> [args...]``; unknown or missing names print the choices and return 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in BENCHMARKS:
        given = repr(args[0]) if args else "nothing"
        print(f"int8alibi bench: expected one of {', '.join(BENCHMARKS)}, got {given}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[args[0]])
    return int(module.main(args[1:]))

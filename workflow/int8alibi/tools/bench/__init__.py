"""``int8alibi bench kernels|faults|dag|plan|decode|seeded``: dispatch to the benchmark named by the first argument.

Each benchmark module is imported only when asked for (inside its loader, by a plain import
statement the import graph sees), so one benchmark's dependencies never burden another.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ...errors import Int8AlibiError

Entry = Callable[[list[str]], int]


def refusing(name: str, bench: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``bench(args)``; an ``Int8AlibiError`` (bad input) printed as one line naming the benchmark, 2."""
    try:
        return bench(args)
    except Int8AlibiError as exc:
        print(f"int8alibi bench {name}: {exc}", file=sys.stderr)
        return 2


def _kernels() -> Entry:
    from .kernels import main

    return main


def _faults() -> Entry:
    from .faults import main

    return main


def _dag() -> Entry:
    from .dag import main

    return main


def _plan() -> Entry:
    from .plan import main

    return main


def _decode() -> Entry:
    from .decode import main

    return main


def _seeded() -> Entry:
    from .seeded import main

    return main


BENCHMARKS: dict[str, Callable[[], Entry]] = {"kernels": _kernels, "faults": _faults, "dag": _dag, "plan": _plan,
                                              "decode": _decode, "seeded": _seeded}
# one line each for `int8alibi bench --help`
ABOUT = {
    "kernels": "each arm's speed against a plain baseline of the same shape (its bits checked first)",
    "faults": "the fault campaign on a model's shapes, against the floor of its exact accumulators",
    "dag": "RESULTS: per stage of a finished run, seconds and peak memory against its floor",
    "plan": "a dry run with nothing to do, against a one-rule Snakefile in the same environment",
    "decode": "one greedy decode step under each arm, against the weights it must read",
    "seeded": "a synthetic parent's seeded weights, worker processes against one process (bytes checked equal)",
}
USAGE = ("usage: int8alibi bench {kernels,faults,dag,plan,decode,seeded} [options]   "
         "(int8alibi bench <name> --help for one's options)")


def main(argv: list[str] | None = None) -> int:
    """Run ``int8alibi bench <name> [args...]``; unknown or missing names print the choices and return 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE + "\n\nbenchmarks:\n" + "\n".join(f"  {name:<8} {text}" for name, text in ABOUT.items()))
        return 0
    if not args or args[0] not in BENCHMARKS:
        given = repr(args[0]) if args else "nothing"
        print(f"int8alibi bench: expected one of {', '.join(BENCHMARKS)}, got {given}", file=sys.stderr)
        return 2
    try:
        entry = BENCHMARKS[args[0]]()
    except ImportError as exc:
        print(f"int8alibi bench {args[0]}: not available: its module cannot be imported ({exc})", file=sys.stderr)
        return 2
    return int(entry(args[1:]))

"""``int8alibi <command>``: one entry point; each command lives in its own module, imported only
when that command runs (so ``verify`` works without, say, the GPU benchmark's dependencies)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from .bench import BENCHMARKS
from .errors import Int8AlibiError

# command -> (target "module:function", one-line help); a function takes argv and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "verify": ("int8alibi.provenance.audit:verify_main",
               "re-hash every output and input the manifests name; check digests, pins and the chain"),
    "diff": ("int8alibi.provenance.audit:diff_main",
             "say which outputs, inputs, params, pins, code and environment differ between two runs"),
    "amend": ("int8alibi.protocol.amend:main", "append a protocol amendment (the only way to change it)"),
    "conform": ("int8alibi.conform:main", "run the conformance checks on two kernel arms"),
    "bench": ("int8alibi.bench:main", "benchmarks (bench kernels | faults | dag RESULTS | plan)"),
}
# bench's own table (a light module): each benchmark resolved on its own, so one missing dependency
# names that benchmark only
SUBCOMMANDS: dict[tuple[str, str], str] = {("bench", name): f"{module}:main" for name, module in BENCHMARKS.items()}
UNAVAILABLE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="int8alibi",
        description="Pre-registered INT8 GEMM interchangeability study: audit, amend and benchmark.",
        epilog="Run 'int8alibi <command> --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text)  # listed for help only: the command's own parser reads its options
    return parser


def version() -> str:
    """The installed package's version (pyproject.toml), or why there is none."""
    from importlib import metadata

    try:
        return metadata.version("int8alibi")
    except metadata.PackageNotFoundError:
        return "(version unknown: the package is not installed; ./bootstrap installs it)"


def resolve(target: str) -> Callable[[list[str]], int]:
    """Import ``module:function``; raise ImportError with a readable message when it is missing."""
    module_name, _, function = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or str(exc)
        raise ImportError(f"module {module_name} cannot be imported (missing: {missing})") from exc
    entry = getattr(module, function, None)
    if not callable(entry):
        raise ImportError(f"module {module_name} has no function {function}()")
    return entry


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``int8alibi <command> [args...]``; return the command's exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        return _exit_code(lambda: _parser().parse_args(args))  # usage or help
    command, rest = args[0], args[1:]
    target = COMMANDS[command][0]
    if rest and (command, rest[0]) in SUBCOMMANDS:
        target, rest = SUBCOMMANDS[(command, rest[0])], rest[1:]
    try:
        entry = resolve(target)
    except ImportError as exc:
        print(f"int8alibi {command}: not available: {exc}", file=sys.stderr)
        return UNAVAILABLE
    try:
        return _exit_code(lambda: entry(rest))
    except Int8AlibiError as exc:
        print(f"int8alibi {command}: {exc}", file=sys.stderr)
        return 1


def _exit_code(call: Callable[[], object]) -> int:
    """Run ``call``; argparse's SystemExit (``--help``, bad options) becomes a return code."""
    try:
        result = call()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return result if isinstance(result, int) else UNAVAILABLE

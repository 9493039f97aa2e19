"""``int8alibi <command>``: one entry point; each command lives in its own module, imported only
when that command runs (so ``verify`` works without, say, the GPU benchmark's dependencies).

Each command's module is imported inside its loader, by a plain import statement, so the import
graph (and every code digest) sees the edge; nothing here imports by a name held in a string.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

from .errors import Int8AlibiError, fault_line
from .printable import printable

Entry = Callable[[list[str]], int]  # takes argv, returns an exit code


def _verify() -> Entry:
    from .provenance.audit import verify_main

    return verify_main


def _diff() -> Entry:
    from .provenance.audit import diff_main

    return diff_main


def _amend() -> Entry:
    from .tools.amend import main

    return main


def _conform() -> Entry:
    from .tools.conform import main

    return main


def _hardware() -> Entry:
    from .tools.hardware import main

    return main


def _disk() -> Entry:
    from .tools.disk import main

    return main


def _bench() -> Entry:
    from .tools.bench import main

    return main


# command -> (loader of its entry function, one-line help); ``int8alibi bench`` dispatches its own names.
COMMANDS: dict[str, tuple[Callable[[], Entry], str]] = {
    "verify": (_verify, "re-hash every output and input the manifests name; check digests, pins and the chain"),
    "diff": (_diff, "say which outputs, inputs, params, pins, code and environment differ between two runs"),
    "amend": (_amend, "append a protocol amendment (the only way to change it)"),
    "conform": (_conform, "run the conformance checks on two kernel arms: tolerance and bitwise readings (--json)"),
    "hardware": (_hardware, "this machine's cores and CUDA devices, and the GPU plan settings they give"),
    "disk": (_disk, "what a config's run writes under its results folder, per stage, against the free space there"),
    "bench": (_bench, "benchmarks (bench kernels | faults | dag RESULTS | plan | decode)"),
}
UNAVAILABLE = 2
FAILED = 2  # the command could not finish: never a finding (conform's 1 is a check that fired, diff's 1 a difference)


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


def resolve(loader: Callable[[], Entry]) -> Entry:
    """The command's entry function; ImportError with a readable message when its module is missing."""
    try:
        return loader()
    except ImportError as exc:  # a module or a name it should hold is missing: say which, in Python's words
        raise ImportError(f"its module cannot be imported ({exc})") from exc


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``int8alibi <command> [args...]``; return the command's exit code.

    What the machine refuses a command (a file operation, memory) is one line naming the file and the
    reason and exit ``FAILED``, as is console output whose reader went away (``| head``): the command
    still runs to its end, so the files it writes are whole.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    out, err = _Console(sys.stdout), _Console(sys.stderr)
    sys.stdout, sys.stderr = out, err  # what print() needs, and the rest passed on (_Console.__getattr__)
    try:
        code = _dispatch(args)
    finally:
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = out.stream, err.stream
    if out.cut or err.cut:
        name = " ".join(args[:1]) or "(usage)"
        if not err.cut:
            print(printable(f"int8alibi {name}: standard output: its reader closed the pipe before the output "
                            "ended (EPIPE); the command ran to its end, its files are whole"), file=sys.stderr)
        return FAILED
    return code


def _dispatch(args: list[str]) -> int:
    if not args or args[0] not in COMMANDS:
        return _exit_code(lambda: _parser().parse_args(args))  # usage or help
    command, rest = args[0], args[1:]
    try:
        entry = resolve(COMMANDS[command][0])
    except ImportError as exc:
        print(f"int8alibi {command}: not available: {exc}", file=sys.stderr)
        return UNAVAILABLE
    try:
        return _exit_code(lambda: entry(rest))
    except Int8AlibiError as exc:
        print(printable(f"int8alibi {command}: {exc}"), file=sys.stderr)
        return 1
    except (OSError, MemoryError, RuntimeError) as exc:  # the machine's refusal is one line; a bug keeps its traceback
        line = fault_line(exc, _writes_into(rest))
        if line is None:
            raise
        print(printable(f"int8alibi {command}: {line}"), file=sys.stderr)
        return FAILED


def _writes_into(rest: list[str]) -> str:
    """Where the command writes (its ``--out``), for a failure the OS reported without naming a file."""
    for flag, value in zip(rest, rest[1:]):
        if flag == "--out":
            return f"the command writes into {value}"
    return ""


def _exit_code(call: Callable[[], object]) -> int:
    """Run ``call``; argparse's SystemExit (``--help``, bad options) becomes a return code."""
    try:
        result = call()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return result if isinstance(result, int) else UNAVAILABLE


class _Console:
    """A standard stream for the length of a command that outlives its reader: once the far end of a pipe
    has closed (``| head``), further text is dropped instead of raising ``BrokenPipeError`` in the middle
    of the command, and ``cut`` says so."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.cut = stream, False

    def write(self, text: str) -> int:
        if not self.cut:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.cut:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        """From now on this stream writes nowhere: also what is still buffered, at the interpreter's exit."""
        self.cut = True
        with contextlib.suppress(OSError, ValueError):  # a stream without a file descriptor (a test's capture)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

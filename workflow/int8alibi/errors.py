"""Errors that stop a run. Every message names the file (or object) and the reason."""

from __future__ import annotations

import errno
import os
import re


class Int8AlibiError(Exception):
    """Base class: anything that does not verify."""


class ProtocolError(Int8AlibiError):
    """The protocol or an amendment does not verify."""


class ManifestError(Int8AlibiError):
    """A manifest or an output named by it does not verify."""


class InputError(Int8AlibiError):
    """An input file (config, checkpoint, operands, corpus) is malformed."""


class GateError(Int8AlibiError):
    """A pre-registered gate failed (e.g. requantization not byte-identical)."""


class DiskFullError(Int8AlibiError):
    """A write failed because the filesystem is full (ENOSPC); nothing partial was left behind."""


class ConfigScopeError(Int8AlibiError):
    """A stage read a config key that its rule does not digest (``int8alibi.planning.stage_needs``)."""


_MEMORY = re.compile(r"can't allocate memory|out of memory", re.IGNORECASE)
_ENFORCE = re.compile(r"^\[enforce fail at [^\]]*\]\s*(err == 0\.\s*)?")  # c10's prefix on torch's CPU allocator error
_NAME_CHARS = 160


def _file(name: object) -> str:
    """A file name as it goes into a line: a very long one shortened in the middle, saying so."""
    text = os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else str(name)
    if len(text) <= 2 * _NAME_CHARS:
        return text
    return f"{text[:_NAME_CHARS]}...{text[-_NAME_CHARS:]} ({len(text)} characters)"


def fault_line(exc: BaseException, context: str = "") -> str | None:
    """One line for a failure the machine reported rather than the code: a file operation the OS refused
    (``file: reason (ERRNO)``; where the OS named no file, ``context`` says where the command was
    writing), or memory that could not be had (``MemoryError``, torch's allocators). None for anything
    else: a bug keeps its traceback."""
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc) or type(exc).__name__
        if exc.errno is not None and exc.errno in errno.errorcode:
            reason += f" ({errno.errorcode[exc.errno]})"
        files = [_file(name) for name in (exc.filename, exc.filename2) if name is not None]
        if files:
            return f"{' -> '.join(files)}: {reason}"
        return f"{reason}; the OS named no file{f' ({context})' if context else ''}"
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and _MEMORY.search(str(exc))):
        lines = str(exc).strip().splitlines()
        detail = _ENFORCE.sub("", lines[0]) if lines else type(exc).__name__
        return f"out of memory: {detail}"
    return None

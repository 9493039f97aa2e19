"""Text that prints as one honest line: control characters and undecodable bytes escaped.

File names may hold a newline, terminal escape codes or bytes that are not UTF-8 (Python keeps
those as lone surrogates). Printed raw, such a name could end a line and start one that looks like
a verdict of the tool itself, or recolour the terminal. Every message the command-line tools
print goes through ``printable``.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """``str(text)`` with every control character, line separator and lone surrogate escaped."""
    return _UNSAFE.sub(_escape, str(text))


_SURROGATE = re.compile(r"[\udc80-\udcff]")


def json_text(text: str) -> str:
    """JSON text with each undecodable byte of a file name (a lone surrogate, which cannot be written
    as UTF-8) spelled ``\\xNN`` inside its string: the output stays valid JSON and UTF-8."""
    return _SURROGATE.sub(lambda m: f"\\\\x{ord(m.group()) - 0xDC00:02x}", text)

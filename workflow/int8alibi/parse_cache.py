"""A memo of strict YAML parses and schema verdicts, keyed by content, for planning.

Every Snakemake invocation runs the protocol gate and validates the config: some thirty YAML files
parsed strictly and checked against their JSON schemas, most of a second of pure Python each time.
What parsing and validating exact bytes with exact code gives never changes, so the Snakefile keeps
it here (``enable``), in one file beside Snakemake's own state: a key is the SHA-256 of the text
(or of the schema and the data) together with the code that decides (this module, ``strict_yaml``,
the PyYAML and jsonschema versions). A byte changed anywhere is parsed and validated again; only
successes are kept (a refusal is decided, and reported, anew every time), and the file holds plain
data only: anything else in it is refused when read, and the memo starts empty.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"not plain data: {module}.{name}")


def _code_key() -> bytes:
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in ("parse_cache.py", "strict_yaml.py"):
        digest.update((here / name).read_bytes())
    for dist in ("PyYAML", "jsonschema"):
        try:
            digest.update(metadata.version(dist).encode())
        except metadata.PackageNotFoundError:
            digest.update(b"absent")
    return digest.digest()


class _Memo:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.code = _code_key()
        try:
            known = _PlainData(io.BytesIO(self.path.read_bytes())).load()
        except (OSError, EOFError, ValueError, TypeError, pickle.UnpicklingError):
            known = {}
        self.known: dict[str, bytes] = known if isinstance(known, dict) else {}
        self.used: dict[str, bytes] = {}

    def key(self, kind: str, payload: bytes) -> str:
        return f"{kind}:{hashlib.sha256(self.code + payload).hexdigest()}"

    def save(self) -> None:
        if self.used == self.known:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(self.used, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, self.path)


_memo: _Memo | None = None


def enable(path: Path) -> None:
    """Keep parses and verdicts in ``path`` (read now, written by ``save``)."""
    global _memo
    _memo = _Memo(path)


def save() -> None:
    """Write what this process used, when it differs from what the file holds (atomically)."""
    if _memo is not None:
        _memo.save()


def parsed(text: str, parse: Callable[[], Any]) -> Any:
    """``parse()`` of ``text``, from the memo when these exact characters parsed before (a fresh copy)."""
    if _memo is None:
        return parse()
    key = _memo.key("yaml", text.encode("utf-8", "surrogatepass"))
    stored = _memo.used.get(key, _memo.known.get(key))
    if stored is not None:
        try:
            value = _PlainData(io.BytesIO(stored)).load()
        except (EOFError, ValueError, TypeError, pickle.UnpicklingError):
            stored = None
    if stored is None:
        value = parse()
        try:
            stored = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            _PlainData(io.BytesIO(stored)).load()  # plain data only: anything else is not kept
        except (pickle.PicklingError, pickle.UnpicklingError, TypeError, AttributeError, RecursionError):
            return value
    _memo.used[key] = stored
    return value


def validated(schema: Any, data: Any, check: Callable[[], None]) -> None:
    """Run ``check()`` (which raises when ``data`` fails ``schema``) unless this pair passed before."""
    if _memo is None:
        check()
        return
    try:
        key = _memo.key("schema", pickle.dumps((schema, data), protocol=pickle.HIGHEST_PROTOCOL))
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
        check()
        return
    if key not in _memo.known and key not in _memo.used:
        check()
    _memo.used[key] = b""

"""SHA-256 digests of files, directory trees, canonical JSON and the package's own code.

Manifests identify everything by content, never by name or timestamp, so a reviewer can tell
whether two runs saw the same bytes. Code digests let a stage rerun exactly when its code changed
(Snakemake does not see edits inside an imported package).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import InputError

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
PACKAGE_NAME = PACKAGE_ROOT.name
_CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def open_regular(path: str | os.PathLike[str], error: type[Exception] = InputError, doing: str = "read") -> BinaryIO:
    """Open a regular file for reading. Anything else (a FIFO, a device, a folder) is ``error`` naming
    it, found without blocking: a FIFO opened plainly would wait forever for a writer."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"{path}: cannot be {doing} ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device")
        raise error(f"{path}: not a regular file ({kind})")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks (checkpoints are gigabytes)."""
    digest = hashlib.sha256()
    with open_regular(path, doing="hashed") as handle:
        try:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        except OSError as exc:
            raise InputError(f"{path}: cannot be hashed ({exc.strerror or exc})") from exc
    return digest.hexdigest()


def _json_default(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return Path(value).as_posix()
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item) and getattr(value, "ndim", 0) == 0:
        return item()
    raise TypeError(f"{type(value).__name__} value {value!r} has no canonical JSON form")


def canonical_json(obj: Any) -> str:
    """One text per value: sorted keys, no whitespace, UTF-8, no NaN/inf (JSON has none)."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
        default=_json_default,
    )


def listing_digest(hashes: Mapping[str, str]) -> str:
    """Digest of a ``{relative path: sha256}`` listing: names and contents both count."""
    digest = hashlib.sha256()
    for rel in sorted(hashes):
        digest.update(f"{rel}\0{hashes[rel]}\n".encode())
    return digest.hexdigest()


def tree_hashes(root: str | os.PathLike[str]) -> dict[str, str]:
    """``{posix path relative to root: sha256}`` for every file under ``root`` (file symlinks followed)."""
    base = Path(root)
    if not base.is_dir():
        raise InputError(f"{root}: not a directory")
    out: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(base):
        for name in files:
            path = Path(dirpath) / name
            if not path.is_file():  # a FIFO or socket would block or fail the read
                raise InputError(f"{path}: not a regular file")
            out[path.relative_to(base).as_posix()] = sha256_file(path)
    return out


def sha256_tree(root: str | os.PathLike[str]) -> str:
    """Digest of a directory: its file names and the bytes of each file."""
    return listing_digest(tree_hashes(root))


TEMPLATES = "templates"  # a package's folder of templates, beside its __init__.py


def package_digest() -> str:
    """Digest of every ``.py`` file and template of the installed int8alibi package (paths and bytes)."""
    files = [*PACKAGE_ROOT.rglob("*.py"), *(p for p in PACKAGE_ROOT.rglob(f"{TEMPLATES}/*") if p.is_file())]
    return listing_digest({path.relative_to(PACKAGE_ROOT).as_posix(): sha256_file(path) for path in files})


def module_file(name: str) -> Path | None:
    """The file of int8alibi module ``name`` (``x.py`` or ``x/__init__.py``), or None."""
    parts = name.split(".")
    if parts[0] != PACKAGE_NAME:
        return None
    base = PACKAGE_ROOT.joinpath(*parts[1:])
    if len(parts) > 1 and base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _imported_names(name: str, path: Path) -> set[str]:
    """Names of int8alibi modules that ``path`` may import (static, including function-level imports)."""
    return imported_names(name, path.name == "__init__.py", ast.parse(path.read_bytes(), filename=str(path)))


def imported_names(name: str, is_package: bool, tree: ast.AST) -> set[str]:
    """Names of int8alibi modules that module ``name`` (parsed as ``tree``) may import."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg_parts = package.split(".")
                base = ".".join(pkg_parts[: len(pkg_parts) - (node.level - 1)])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {n for n in found if n.split(".")[0] == PACKAGE_NAME}


def module_closure(module_names: Iterable[str],
                   imports: Callable[[str, Path], set[str]] = _imported_names,
                   locate: Callable[[str], Path | None] = module_file) -> list[str]:
    """Package-relative paths of the given modules, their parent packages and every int8alibi
    module they import, transitively (``imports(name, path)`` names a module's imports and
    ``locate(name)`` its file; a caller may cache both). Unknown starting modules are an error."""
    todo: list[str] = []
    for name in module_names:
        if locate(name) is None:
            raise InputError(f"module {name!r}: not a module of the {PACKAGE_NAME} package")
        todo.append(name)
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = locate(name)
        if path is None:  # ``from . import attribute``: not a module, nothing to add
            continue
        seen[name] = path
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(imports(name, path))
    return sorted(path.relative_to(PACKAGE_ROOT).as_posix() for path in seen.values())


def package_templates(root: Path, modules: Iterable[str]) -> list[Path]:
    """Every file under the ``templates/`` folder of each package among ``modules`` (paths relative to
    ``root``, the package root, as ``module_closure`` gives them), sorted: a template is code the
    package runs (the report's page form), so it counts wherever the package's modules do."""
    folders = {root / Path(rel).parent / TEMPLATES for rel in modules if Path(rel).name == "__init__.py"}
    return sorted(path for folder in folders if folder.is_dir() for path in folder.rglob("*") if path.is_file())


def stage_code_digest(module_names: Iterable[str]) -> str:
    """Digest of exactly the package code the given modules can run (see ``module_closure``), their
    packages' templates included."""
    modules = module_closure(module_names)
    files = [PACKAGE_ROOT / rel for rel in modules] + package_templates(PACKAGE_ROOT, modules)
    return listing_digest({path.relative_to(PACKAGE_ROOT).as_posix(): sha256_file(path) for path in files})

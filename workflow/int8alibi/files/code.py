"""Code digests that decide reruns: a module's syntax tree, without comments, docstrings or layout.

A comment or docstring edit, or moving lines about, does not change what a stage computes, so it
reruns nothing; any other edit changes the module's digest. Each digest (and the module's imports,
which give a stage's closure) is remembered by the SHA-256 of the file's bytes in one JSON file, so
a parse re-reads only the files but parses only those that changed; and the stages' closures are
remembered beside them under a stamp of the package's files (path, size, mtime, inode: the key the
source-file digests use), so a parse with no file touched reads none. Manifests keep recording the
byte digest of the code that ran (``hashing.stage_code_digest``).

A package's templates (the files under its ``templates/`` folder, e.g. the report's page form) decide
a stage's output as its code does, so a stage's closure holds them too, digested by their bytes: any
template edit reruns the stages whose closure holds that package.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any

from . import hashing
from .hashing import TEMPLATES, imported_names, module_closure, module_file, package_templates, sha256_bytes

_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_CLOSURES = "closures"  # the cache's entry of closures: {"stamp": ..., "modules": {module: {path: digest}}}


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, _DOCUMENTED) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value,
                                                                                                    str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def syntax_digest(source: bytes, filename: str = "<module>") -> str:
    """SHA-256 of the module's syntax tree without docstrings (comments and layout never enter a tree)."""
    tree = _without_docstrings(ast.parse(source, filename=filename))
    return sha256_bytes(ast.dump(tree).encode())


class CodeDigests:
    """Per-module syntax digests and imports, cached by file content in ``cache`` (a JSON file)."""

    def __init__(self, cache: Path) -> None:
        self.cache = Path(cache)
        try:
            self.known: dict[str, Any] = json.loads(self.cache.read_text())
        except (OSError, ValueError):
            self.known = {}
        self.used: dict[str, Any] = {}
        self._files: dict[Path, tuple[str, str, list[str]]] = {}
        self._closures: dict[str, dict[str, str]] = {}
        self._located: dict[str, Path | None] = {}
        self._stamp = package_stamp()
        kept = self.known.get(_CLOSURES)
        self._kept: dict[str, Any] = (kept["modules"] if isinstance(kept, dict) and kept.get("stamp") == self._stamp
                                      and isinstance(kept.get("modules"), dict) else {})

    def _entry(self, name: str, path: Path) -> tuple[str, str, list[str]]:
        """``(content sha256, syntax digest, imports)`` of one file, read once per parse."""
        if path not in self._files:
            data = path.read_bytes()
            key = f"{name}|{path.name == '__init__.py'}|{sha256_bytes(data)}"
            entry = self.known.get(key)
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
                tree = ast.parse(data, filename=str(path))
                entry = [syntax_digest(data, str(path)), sorted(imported_names(name, path.name == "__init__.py", tree))]
            self.used[key] = entry
            self._files[path] = (key, str(entry[0]), [str(n) for n in entry[1]])
        return self._files[path]

    def imports(self, name: str, path: Path) -> set[str]:
        return set(self._entry(name, path)[2])

    def locate(self, name: str) -> Path | None:
        """``hashing.module_file``, asked once per name in this parse."""
        if name not in self._located:
            self._located[name] = module_file(name)
        return self._located[name]

    def closure(self, module: str) -> dict[str, str]:
        """``{package-relative path: digest}`` of every module ``module`` can run (``module_closure``; the
        syntax digest) and of every template of those modules' packages (``package_templates``; bytes)."""
        kept = self._kept.get(module)
        if module not in self._closures and isinstance(kept, dict):
            self._closures[module] = {str(k): str(v) for k, v in kept.items()}
        if module not in self._closures:
            root = hashing.PACKAGE_ROOT
            out = {}
            modules = module_closure([module], imports=self.imports, locate=self.locate)
            for rel in modules:
                parts = Path(rel).with_suffix("").parts
                name = ".".join((root.name, *(parts[:-1] if parts[-1] == "__init__" else parts)))
                out[f"{root.name}/{rel}"] = self._entry(name, root / rel)[1]
            for path in package_templates(root, modules):
                out[f"{root.name}/{path.relative_to(root).as_posix()}"] = hashing.sha256_file(path)
            self._closures[module] = out
        return dict(self._closures[module])

    def save(self) -> None:
        """Keep what this parse used; written only when that changed (atomically: jobs may parse at once).
        Closures taken from the cache keep the file entries they were computed from."""
        if self._kept:
            for key, entry in self.known.items():
                if key != _CLOSURES:
                    self.used.setdefault(key, entry)
        self.used[_CLOSURES] = {"stamp": self._stamp, "modules": {**self._kept, **self._closures}}
        if self.used == self.known:
            return
        self.cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.used, sort_keys=True, indent=0))
        os.replace(tmp, self.cache)


def package_stamp() -> str:
    """SHA-256 of every package ``.py`` file's and template's relative path, size, mtime and inode:
    equal stamps, files untouched (a closure over them is still what it was)."""
    root = hashing.PACKAGE_ROOT
    rows = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
        in_templates = TEMPLATES in Path(folder).relative_to(root).parts
        for name in sorted(f for f in files if in_templates or f.endswith(".py")):
            st = os.stat(os.path.join(folder, name))
            rel = Path(folder, name).relative_to(root).as_posix()
            rows.append(f"{rel}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}")
    return sha256_bytes("\n".join(rows).encode())

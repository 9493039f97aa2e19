"""Digests: standard SHA-256 vectors, canonical JSON, directory trees, package and stage code."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from int8alibi.errors import InputError
from int8alibi.files import hashing
from int8alibi.files.hashing import (canonical_json, module_closure, package_digest, sha256_bytes,
                                          sha256_file, sha256_tree, stage_code_digest)

# FIPS 180-2 test vectors
ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_standard_vectors(tmp_path: Path) -> None:
    assert sha256_bytes(b"abc") == ABC
    assert sha256_bytes(b"") == EMPTY
    (tmp_path / "abc").write_bytes(b"abc")
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "abc") == ABC
    assert sha256_file(tmp_path / "empty") == EMPTY


def test_file_hash_across_chunk_boundary(tmp_path: Path) -> None:
    data = np.random.default_rng(0).integers(0, 256, (1 << 20) + 1, dtype=np.uint8).tobytes()
    (tmp_path / "big").write_bytes(data)
    assert sha256_file(tmp_path / "big") == hashlib.sha256(data).hexdigest()
    with pytest.raises(InputError, match="nothing: cannot be hashed"):
        sha256_file(tmp_path / "nothing")


def test_canonical_json() -> None:
    a = canonical_json({"b": [1, 2.5, None], "a": {"y": True, "x": "ü"}})
    b = canonical_json({"a": {"x": "ü", "y": True}, "b": [1, 2.5, None]})
    assert a == b == '{"a":{"x":"ü","y":true},"b":[1,2.5,null]}'
    assert canonical_json({"p": Path("results/x.parquet"), "n": np.int64(7), "f": np.float32(0.5)}) == \
        '{"f":0.5,"n":7,"p":"results/x.parquet"}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})
    with pytest.raises(TypeError, match="no canonical JSON form"):
        canonical_json({"x": object()})


def test_tree_digest_sees_names_and_bytes(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "sub" / "w.bin").write_bytes(b"\x01\x02")
    first = sha256_tree(root)
    (root / "sub" / "w.bin").write_bytes(b"\x01\x03")
    changed = sha256_tree(root)
    (root / "sub" / "w.bin").write_bytes(b"\x01\x02")
    assert sha256_tree(root) == first != changed
    (root / "sub" / "w.bin").rename(root / "sub" / "v.bin")
    assert sha256_tree(root) != first
    with pytest.raises(InputError, match="not a directory"):
        sha256_tree(root / "config.json")


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "int8alibi"
    shutil.copytree(hashing.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_package_digest_depends_on_code_and_templates_only(package_copy: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    original = package_digest()
    monkeypatch.setattr(hashing, "PACKAGE_ROOT", package_copy)
    assert package_digest() == original  # location does not matter
    (package_copy / "notes.txt").write_text("not code")
    assert package_digest() == original
    page = package_copy / "report" / "templates" / "page.md"
    form = page.read_text()
    page.write_text(form + "\n")
    assert package_digest() != original  # a template is the report's code
    page.write_text(form)
    errors = package_copy / "errors.py"
    text = errors.read_text()
    errors.write_text(text + "\n")
    edited = package_digest()
    errors.write_text(text)
    assert package_digest() == original != edited
    errors.rename(package_copy / "errors2.py")
    assert package_digest() != original


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "int8alibi"
    _write(root, "__init__.py", "")
    _write(root, "errors.py", "class E(Exception): ...\n")
    _write(root, "arith/__init__.py", "from .bf16 import r\n")
    _write(root, "arith/bf16.py", "from ..errors import E\ndef r(): ...\n")
    _write(root, "lazy.py", "X = 1\n")
    _write(root, "unrelated.py", "Y = 2\n")
    _write(root, "stages/__init__.py", "")
    _write(root, "stages/faults.py",
           "import numpy\nfrom ..arith import r\nfrom . import helpers\n"
           "def run():\n    from int8alibi import lazy\n    return lazy.X\n")
    _write(root, "stages/helpers.py", "import int8alibi.errors\n")
    monkeypatch.setattr(hashing, "PACKAGE_ROOT", root)
    return root


def test_module_closure_follows_relative_absolute_and_function_imports(fake_package: Path) -> None:
    assert module_closure(["int8alibi.stages.faults"]) == sorted([
        "__init__.py", "errors.py", "arith/__init__.py", "arith/bf16.py", "lazy.py",
        "stages/__init__.py", "stages/faults.py", "stages/helpers.py",
    ])
    with pytest.raises(InputError, match="'int8alibi.stages.nope': not a module"):
        module_closure(["int8alibi.stages.nope"])


def test_stage_code_digest_changes_only_with_code_the_stage_can_run(fake_package: Path) -> None:
    before = stage_code_digest(["int8alibi.stages.faults"])
    _write(fake_package, "unrelated.py", "Y = 3\n")
    assert stage_code_digest(["int8alibi.stages.faults"]) == before
    _write(fake_package, "arith/bf16.py", "from ..errors import E\ndef r(): return 1\n")
    assert stage_code_digest(["int8alibi.stages.faults"]) != before


def test_stage_code_digest_counts_the_templates_of_the_packages_it_runs(fake_package: Path) -> None:
    _write(fake_package, "arith/templates/form.md", "{{ x }}\n")
    _write(fake_package, "unrelated_pkg/__init__.py", "")
    _write(fake_package, "unrelated_pkg/templates/other.md", "a\n")
    before = stage_code_digest(["int8alibi.stages.faults"])
    _write(fake_package, "unrelated_pkg/templates/other.md", "b\n")
    assert stage_code_digest(["int8alibi.stages.faults"]) == before
    _write(fake_package, "arith/templates/form.md", "{{ y }}\n")
    assert stage_code_digest(["int8alibi.stages.faults"]) != before

"""Code digests that decide reruns: a comment, docstring or layout edit changes nothing; any other
edit changes the digest of that module only, and of the stages that can run it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from int8alibi.files import hashing
from int8alibi.files.code import CodeDigests, syntax_digest

SOURCE = '''"""Module docstring."""
import os  # why


def f(x):
    """Function docstring."""
    return x + 1  # add one


class C:
    """Class docstring."""

    def g(self):
        """Only a docstring."""
'''


def test_comments_docstrings_and_layout_do_not_move_the_digest() -> None:
    base = syntax_digest(SOURCE.encode())
    edited = (SOURCE.replace("# why", "# another reason").replace('"""Function docstring."""', '"""Changed."""')
              .replace('"""Module docstring."""', "") + "\n\n# a trailing comment\n")
    assert syntax_digest(edited.encode()) == base
    assert syntax_digest(SOURCE.replace("def f(x):", "def f(x):\n\n").encode()) == base  # blank lines
    assert syntax_digest(SOURCE.replace('"""Only a docstring."""', "pass").encode()) == base  # empty body


@pytest.mark.parametrize("edit", [("x + 1", "x + 2"), ("import os", "import sys"), ("def f(x)", "def f(y)"),
                                  ("return x + 1", "return (x + 1)  # same tree, other text"),
                                  ('"""Class docstring."""', '"""Class docstring."""\n    X = "text"')])
def test_a_code_edit_moves_the_digest(edit: tuple[str, str]) -> None:
    edited = SOURCE.replace(*edit)
    same_tree = edit[0] == "return x + 1"  # parentheses are layout: the same tree
    assert (syntax_digest(edited.encode()) == syntax_digest(SOURCE.encode())) is same_tree


def _write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "int8alibi"
    _write(root, "__init__.py", "")
    _write(root, "errors.py", "class E(Exception): ...\n")
    _write(root, "unrelated.py", "Y = 2\n")
    _write(root, "stages/__init__.py", "")
    _write(root, "stages/alpha.py", "from ..errors import E\n\ndef run():\n    raise E\n")
    monkeypatch.setattr(hashing, "PACKAGE_ROOT", root)
    return root


def test_closure_digests_each_module_and_remembers_them_by_content(package: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "code.json"
    first = CodeDigests(cache)
    digests = first.closure("int8alibi.stages.alpha")
    assert sorted(digests) == ["int8alibi/__init__.py", "int8alibi/errors.py", "int8alibi/stages/__init__.py",
                               "int8alibi/stages/alpha.py"]
    first.save()
    assert len([key for key in json.loads(cache.read_text()) if key != "closures"]) == 4
    _write(package, "stages/alpha.py", "from ..errors import E  # a comment\n\ndef run():\n    raise E\n")
    _write(package, "unrelated.py", "Y = 3\n")
    assert CodeDigests(cache).closure("int8alibi.stages.alpha") == digests
    _write(package, "errors.py", "class E(ValueError): ...\n")
    changed = CodeDigests(cache).closure("int8alibi.stages.alpha")
    assert [rel for rel in digests if digests[rel] != changed[rel]] == ["int8alibi/errors.py"]


def test_a_cached_entry_is_used_without_parsing(package: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "code.json"
    digests = CodeDigests(cache)
    expected = digests.closure("int8alibi.stages.alpha")
    digests.save()
    import int8alibi.files.code as code

    monkeypatch.setattr(code, "syntax_digest", lambda *a: pytest.fail("parsed although cached"))
    assert CodeDigests(cache).closure("int8alibi.stages.alpha") == expected


def test_closures_are_reused_while_no_package_file_is_touched(package: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "code.json"
    first = CodeDigests(cache)
    expected = first.closure("int8alibi.stages.alpha")
    first.save()
    with monkeypatch.context() as patch:  # nothing touched: not one file is read again
        patch.setattr(CodeDigests, "_entry", lambda *a: pytest.fail("read a file although no file changed"))
        again = CodeDigests(cache)
        assert again.closure("int8alibi.stages.alpha") == expected
        again.save()
    assert len([key for key in json.loads(cache.read_text()) if key != "closures"]) == 4  # file entries kept
    st = (package / "errors.py").stat()
    os.utime(package / "errors.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched, same bytes
    reads: list[Path] = []
    real_entry = CodeDigests._entry
    monkeypatch.setattr(CodeDigests, "_entry", lambda self, name, path: reads.append(path) or real_entry(self, name, path))
    assert CodeDigests(cache).closure("int8alibi.stages.alpha") == expected  # recomputed: the same digests
    assert package / "errors.py" in reads
    _write(package, "stages/beta.py", "from ..errors import E\n")  # a new module changes the stamp too
    _write(package, "stages/alpha.py", "from . import beta\n\ndef run():\n    return beta\n")
    assert "int8alibi/stages/beta.py" in CodeDigests(cache).closure("int8alibi.stages.alpha")


def test_a_template_edit_moves_the_digest_of_the_stages_whose_packages_ship_it(package: Path, tmp_path: Path) -> None:
    """Templates decide a stage's output as its code does: a stage that imports a package with a
    templates/ folder holds each template's byte digest; an edit to one moves that digest only, and
    also when the stage's closure was cached (the stamp covers templates)."""
    _write(package, "report/__init__.py", "")
    _write(package, "report/render.py", "X = 1\n")
    _write(package, "report/templates/page.html", "<p>{{ x }}</p>\n")
    _write(package, "report/templates/parts/row.md", "| {{ x }} |\n")
    _write(package, "stages/alpha.py", "from ..report import render\n")
    cache = tmp_path / "code.json"
    first = CodeDigests(cache)
    digests = first.closure("int8alibi.stages.alpha")
    first.save()
    assert {"int8alibi/report/templates/page.html", "int8alibi/report/templates/parts/row.md"} <= set(digests)
    assert not [rel for rel in first.closure("int8alibi.errors") if "templates" in rel]  # no such package imported
    _write(package, "report/templates/page.html", "<p>{{ x }}!</p>\n")
    changed = CodeDigests(cache).closure("int8alibi.stages.alpha")
    assert [rel for rel in digests if digests[rel] != changed[rel]] == ["int8alibi/report/templates/page.html"]


def test_the_report_stages_hold_every_report_template(tmp_path: Path) -> None:
    templates = hashing.PACKAGE_ROOT / "report" / "templates"
    shipped = {f"int8alibi/{p.relative_to(hashing.PACKAGE_ROOT).as_posix()}" for p in templates.rglob("*") if p.is_file()}
    assert shipped
    for stage in ("report", "crossmodel"):
        assert shipped <= set(CodeDigests(tmp_path / "code.json").closure(f"int8alibi.stages.{stage}"))

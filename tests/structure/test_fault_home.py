"""The fault application has one home, ``faults.catalogue``: no other module applies a fault family.

A function of a module that imports torch (a fault is applied to tensors; the report and the
analysis read tables) applies a fault family (``applications``) when it
* defines or calls a per-family function (a name like ``f6``, ``_f9_pct``, ``f1_scale_precision``),
* dispatches on a family: compares a value with a fault id (alone or in a tuple, list or set),
  builds a table keyed by fault ids whose values are functions, or matches on a fault id,
* takes a step only a fault takes on a scaled INT8 GEMM: ``nextafter`` (F9 pct's nudged scales) or
  ``bf16_rtz`` (F4's truncated output), or
* or, in any module, is a copy of a function of the home: the same body up to the names of its
  variables (functions of at least ``MIN_NODES`` nodes; smaller ones say too little to be told
  from other code).

Fault ids are F1-F7 and F9: F8 applies nothing (arm B is the reference), so code that names it, such
as the token stage's check that the F8 copy equals the reference, applies no fault.

The campaign's engines and the token-level injection import the home and leave all of this to it.
The rules are held to the three copies that existed before the home did (461e8fb: the per-cell
engine, the batched engine and the injection arm each applied the faults themselves) and to a
planted copy of each of the home's functions.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess

import pytest

from int8alibi.files.hashing import PACKAGE_NAME, PACKAGE_ROOT

from .import_graph import import_edges, package_modules

HOME = f"{PACKAGE_NAME}.faults.catalogue"
USERS = tuple(f"{PACKAGE_NAME}.{m}" for m in ("faults.campaign", "faults.batched", "tokens.inject"))
FAULT_ID = re.compile(r"^F[1-79]$")
PER_FAMILY = re.compile(r"^_?f[1-79](_\w*)?$")
FAULT_ONLY_CALLS = frozenset({"nextafter", "bf16_rtz"})
MIN_NODES = 40
BEFORE_THE_HOME = "461e8fb"


def _name(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _is_fault_id(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_fault_id(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(FAULT_ID.match(node.value))


def _reasons(node: ast.AST) -> list[str]:
    """What makes one node part of applying a fault family (see the module docstring)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and PER_FAMILY.match(node.name):
        return [f"defines {node.name}"]
    if isinstance(node, ast.Call):
        name = _name(node.func)
        if PER_FAMILY.match(name) or name in FAULT_ONLY_CALLS:
            return [f"calls {name}"]
    if isinstance(node, ast.Compare) and any(_is_fault_id(n) for n in (node.left, *node.comparators)):
        return ["compares with a fault id"]
    if isinstance(node, ast.Dict) and any(k is not None and _is_fault_id(k) for k in node.keys) and any(
            isinstance(v, ast.Lambda) or PER_FAMILY.match(_name(v)) for v in node.values):
        return ["a dispatch table keyed by fault ids"]
    if isinstance(node, ast.MatchValue) and _is_fault_id(node.value):
        return ["matches a fault id"]
    return []


def _shape(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The function's body (docstring left out) with its names numbered in order of appearance, so
    that a copy with other variable names has the same shape."""
    body = function.body[1:] if ast.get_docstring(function) is not None else function.body
    numbers: dict[str, str] = {}
    copy = ast.parse(ast.unparse(ast.Module(body=body, type_ignores=[])))
    for node in ast.walk(copy):
        if isinstance(node, ast.Name):
            node.id = numbers.setdefault(node.id, f"v{len(numbers)}")
        elif isinstance(node, ast.arg):
            node.arg = numbers.setdefault(node.arg, f"v{len(numbers)}")
    return ast.dump(copy)


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def home_shapes(home: ast.Module) -> dict[str, str]:
    """Shape -> name of every function of the home large enough to be recognised."""
    return {_shape(f): f.name for f in _functions(home) if sum(1 for _ in ast.walk(f)) >= MIN_NODES}


def _imports_torch(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name.split(".")[0] == "torch" for a in n.names)
               or isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "torch" for n in ast.walk(tree))


def applications(tree: ast.Module, shapes: dict[str, str]) -> list[str]:
    """``where: reason`` for every fault application in a module (``where``: the innermost
    function, or ``<module>``)."""
    found: list[str] = []
    on_tensors = _imports_torch(tree)

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            where = node.name if where == "<module>" else f"{where}.{node.name}"
        if on_tensors:
            found.extend(f"{where}: {reason}" for reason in _reasons(node))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _shape(node) in shapes:
            found.append(f"{where}: a copy of the home's {shapes[_shape(node)]}")
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(tree, "<module>")
    return found


@pytest.fixture(scope="module")
def modules() -> dict[str, ast.Module]:
    return {name: mod.tree for name, mod in package_modules(PACKAGE_ROOT).items()}


@pytest.fixture(scope="module")
def shapes(modules: dict[str, ast.Module]) -> dict[str, str]:
    return home_shapes(modules[HOME])


def test_only_the_home_applies_a_fault_family(modules: dict[str, ast.Module], shapes: dict[str, str]) -> None:
    found = {name: applications(tree, shapes) for name, tree in modules.items() if name != HOME}
    assert {name: hits for name, hits in found.items() if hits} == {}
    assert applications(modules[HOME], {}), "the rules find nothing in the home itself: they see nothing"


def test_the_engines_and_the_injection_arm_import_the_home() -> None:
    edges = import_edges(package_modules(PACKAGE_ROOT))
    assert [user for user in USERS if HOME not in edges[user]] == []


def test_a_planted_copy_of_any_function_of_the_home_is_found(modules: dict[str, ast.Module],
                                                             shapes: dict[str, str]) -> None:
    """Each function of the home, copied into another module under another name, and once more with
    its variables renamed."""
    home = modules[HOME]
    large = [f for f in _functions(home) if f.name in shapes.values()]
    assert {"epilogue_fault", "fused_reduction", "inflate", "step_one"} <= {f.name for f in large}
    for function in large:
        planted = ast.parse(ast.unparse(function).replace(f"def {function.name}(", "def helper(", 1))
        assert applications(planted, shapes), function.name
        renamed = ast.parse(ast.unparse(planted))
        for node in ast.walk(renamed):
            if isinstance(node, ast.Name):
                node.id = f"{node.id}_x"
        assert applications(renamed, shapes), f"{function.name} with renamed variables"


@pytest.mark.parametrize("source,reason", [
    ("def f(cell):\n    if cell.fault == 'F6':\n        return 1\n", "compares with a fault id"),
    ("def f(x):\n    return x in ('F1', 'F2')\n", "compares with a fault id"),
    ("def f(a, b):\n    table = {'F1': lambda: a, 'F2': lambda: b}\n    return table\n",
     "a dispatch table keyed by fault ids"),
    ("def f(s):\n    return torch.nextafter(s, s + 1)\n", "calls nextafter"),
    ("def f(x):\n    return cat.f9_all(x)\n", "calls f9_all"),
    ("class A:\n    def _f6(self):\n        return 1\n", "defines _f6"),
    ("def f(fault):\n    match fault:\n        case 'F4':\n            return 1\n", "matches a fault id"),
])
def test_each_rule_fires(source: str, reason: str, shapes: dict[str, str]) -> None:
    assert [hit.split(": ", 1)[1] for hit in applications(ast.parse("import torch\n" + source), shapes)] == [reason]
    assert applications(ast.parse(source), shapes) == []   # without torch: a table reader


def test_labels_metadata_and_the_null_fault_are_not_applications(shapes: dict[str, str]) -> None:
    source = ("import torch\nSEVERITIES = {'F8': ('all',), 'F9': ('one', 'pct')}\n"
              "def rows(fault):\n    return [('F6', 'all'), (fault, 'one')]\n"
              "def null(cell):\n    return cell.fault == 'F8'\n")
    assert applications(ast.parse(source), shapes) == []


def test_the_copies_before_the_home_are_found(shapes: dict[str, str]) -> None:
    """At 461e8fb the per-cell engine, the batched engine and the injection arm each applied the faults."""
    root = PACKAGE_ROOT.parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("needs the project's git history")
    files = {"faults/campaign.py": "_LayerRun", "faults/batched.py": "_f6", "tokens/inject.py": "InjectionArm"}
    for path, where in files.items():
        shown = subprocess.run(["git", "-C", str(root), "show", f"{BEFORE_THE_HOME}:workflow/{PACKAGE_NAME}/{path}"],
                               capture_output=True, text=True, check=False)
        if shown.returncode != 0:
            pytest.skip(f"{BEFORE_THE_HOME} is not in this clone's history")
        hits = applications(ast.parse(shown.stdout), shapes)
        assert any(hit.startswith(where) for hit in hits), (path, hits)


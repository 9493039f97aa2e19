"""The mutation check's own parts: the mutants it makes of a small module, that each compiles and
changes the source, that its targets name files that exist, and that it never writes the module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("mutants", ROOT / "dev" / "mutants.py")
mutants = importlib.util.module_from_spec(SPEC)
sys.modules["mutants"] = mutants
SPEC.loader.exec_module(mutants)

SOURCE = '''"""Docstring: never mutated."""
LIMIT = 64
NAMES = ("a", "b")


def check(x: int, flags: dict) -> bool:
    """Nor this one."""
    if x > LIMIT and not flags.get("off", False):
        raise ValueError(f"{x} is more than {LIMIT + 1}")
    return min(x, 3) == 3 or x in NAMES
'''


def _texts(found: list) -> set[tuple[str, str]]:
    return {(SOURCE[m.start:m.end], m.text) for m in found}


def test_the_mutants_of_a_small_module() -> None:
    found = mutants.mutants("demo", mutants.Target("demo.py", ()), SOURCE)
    texts = _texts(found)
    expected = {
        ("64", "65"), ("64", "63"),                                   # a constant moved by one
        ('("a", "b")', "(('b',))"), ('("a", "b")', "(('a',))"),        # an element left out
        ("x > LIMIT", "x >= LIMIT"),                                   # a flipped comparison
        ('not flags.get("off", False)', "(flags.get('off', False))"),  # a dropped not
        ("False", "True"),                                             # a swapped boolean
        ('raise ValueError(f"{x} is more than {LIMIT + 1}")', "pass"),  # a dropped check
        ("min", "max"),
        ("3", "4"), ("3", "2"),
        ("x in NAMES", "x not in NAMES"),
    }
    assert expected <= texts
    assert not any("Docstring" in before or "Nor this" in before for before, _ in texts)
    assert not any("more than" in before and "raise" not in before for before, _ in texts)  # messages kept
    for m in found:
        mutated = m.apply(SOURCE)
        assert mutated != SOURCE
        compile(mutated, "demo.py", "exec")
    assert len({m.key for m in found}) == len(found)                  # keys tell every mutant apart


def test_a_function_filter_keeps_only_that_functions_mutants() -> None:
    found = mutants.mutants("demo", mutants.Target("demo.py", (), ("check",)), SOURCE)
    assert found and all(":check:" in m.key for m in found)


def test_the_sample_is_stable_and_its_size() -> None:
    found = mutants.mutants("demo", mutants.Target("demo.py", ()), SOURCE)
    one, two = mutants.sample(found, 5, "s"), mutants.sample(list(reversed(found)), 5, "s")
    assert [m.key for m in one] == [m.key for m in two] and len(one) == 5
    assert mutants.sample(found, None, "s") == found


def test_every_target_names_a_module_and_test_files_that_exist() -> None:
    for name, target in mutants.TARGETS.items():
        assert (ROOT / "workflow" / target.path).is_file(), name
        for test in target.tests:
            assert (ROOT / test.split("::")[0]).is_file(), (name, test)


def test_the_equivalents_file_names_real_mutants_each_with_a_reason() -> None:
    listed = mutants.equivalent_keys()
    assert listed and all(reason for reason in listed.values())
    keys = {m.key for name, target in mutants.TARGETS.items() if any(k.startswith(f"{name}:") for k in listed)
            for m in mutants.mutants(name, target)}
    assert set(listed) <= keys, sorted(set(listed) - keys)

"""ksweep.yaml against its schema and cross-checks: the comparator order, the selection rules, the estimators."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from int8alibi.errors import ProtocolError
from int8alibi.protocol.load import _verify_ksweep
from int8alibi.protocol.schema import read_yaml, validate

PROJECT = Path(__file__).resolve().parents[2]
SOURCE = PROJECT / "preregistration" / "ksweep.yaml"


@pytest.fixture
def spec() -> dict[str, Any]:
    data = copy.deepcopy(read_yaml(SOURCE, str(SOURCE)))
    validate(data, "ksweep.schema.yaml", str(SOURCE))
    return data


def test_registered_file_passes_its_cross_checks(spec: dict[str, Any]) -> None:
    _verify_ksweep(spec)
    for fmt in ("int8", "fp8"):
        assert spec["paper"]["comparator"]["order"][fmt] == [p["id"] for p in spec["pairs"] if p["format"] == fmt]


def test_comparator_order_must_follow_the_registration_order(spec: dict[str, Any]) -> None:
    spec["paper"]["comparator"]["order"]["fp8"].reverse()
    with pytest.raises(ProtocolError, match="comparator.order.fp8 must list the fp8 pairs"):
        _verify_ksweep(spec)


def test_comparator_order_must_name_every_pair_of_its_format(spec: dict[str, Any]) -> None:
    spec["paper"]["comparator"]["order"]["fp8"].pop()
    with pytest.raises(ProtocolError, match="registration order of `pairs`"):
        _verify_ksweep(spec)


@pytest.mark.parametrize(("path", "value"), [
    (("models", "selection", "rule"), "parsimony"),
    (("paper", "comparator", "rule"), "alphabetical"),
    (("statistics", "per_k"), None),
    (("statistics", "median_relative_difference"), None),
])
def test_schema_refuses_another_rule_or_a_missing_estimator(spec: dict[str, Any], path: tuple[str, ...],
                                                            value: Any) -> None:
    node = spec
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    with pytest.raises(ProtocolError, match="does not match ksweep.schema.yaml"):
        validate(spec, "ksweep.schema.yaml", str(SOURCE))

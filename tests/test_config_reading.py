"""Reading a config: overrides (key=value, nested keys), a run config's unexpanded variables, the
unresolved arms, a file that is not a mapping, the plan a run config is reused for, and the length
at which a value or a schema message is shortened."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

from int8alibi import config as cfgmod
from int8alibi.config import (RESOLVED, apply_overrides, earlier_plan, load_config, results_dir, run_config_path,
                              write_run_config)
from int8alibi.errors import InputError

PROJECT = Path(__file__).resolve().parents[1]


def user_config(**overrides) -> dict:
    data = yaml.safe_load((PROJECT / "config" / "config.yaml").read_text())
    data.update(overrides)
    return data


def _planned(data: dict, **resolved) -> dict:
    block = {"spec": copy.deepcopy({"device": data["device"], "arms": data["arms"]}), "device": "cpu",
             "arms": ["exact-cutlass-order", "exact-triton-order"], "reason": {"device": "d", "arms": "a"},
             "host": "h", "unavailable": {}, **resolved}
    return {**data, RESOLVED: block}


def test_overrides_set_the_leaf_and_keep_its_siblings() -> None:
    data = {"a": {"b": 1, "c": 2}, "d": 3}
    assert apply_overrides(data, ["a.b=5"]) == {"a": {"b": 5, "c": 2}, "d": 3}
    assert apply_overrides(data, ["x.y.z=true", "d=[1, 2]"]) == {"a": {"b": 1, "c": 2}, "d": [1, 2],
                                                                  "x": {"y": {"z": True}}}
    assert apply_overrides(data, {"a.c": 7}) == {"a": {"b": 1, "c": 7}, "d": 3}
    assert apply_overrides(data, ["d=a=b"]) == {"a": {"b": 1, "c": 2}, "d": "a=b"}   # the first = splits
    assert data == {"a": {"b": 1, "c": 2}, "d": 3}                                     # the input is left alone


def test_an_override_without_a_value_is_refused() -> None:
    with pytest.raises(InputError, match=r"override 'exploratory': expected key=value"):
        apply_overrides({}, ["exploratory"])


def test_auto_arms_without_a_plan_are_refused_and_named_arms_read(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(user_config(device="cpu", arms="auto")))
    with pytest.raises(InputError, match=r"arms: auto is resolved once per run"):
        _ = load_config(path).resolved_arms
    path.write_text(yaml.safe_dump(user_config(device="cpu", arms=["exact-cutlass-order", "exact-triton-order"])))
    assert load_config(path).resolved_arms == ["exact-cutlass-order", "exact-triton-order"]


def test_a_config_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(InputError, match=rf"{path}: config must be a mapping"):
        load_config(path)


def test_a_run_config_with_a_variable_left_unexpanded_is_refused_naming_it(checkout: Path) -> None:
    data = user_config(device="cpu", arms=["exact-cutlass-order", "exact-triton-order"], results="results")
    planned = _planned(data, host="planner-9")
    planned["model"] = {"source": "hf", "parent": "${NOT_SET_ANYWHERE}/x"}  # a path: variables are for paths
    path = Path(run_config_path("results", planned))
    write_run_config(planned, path)
    with pytest.raises(InputError, match=r"model\.parent: \$\{NOT_SET_ANYWHERE\} was not expanded: .* host "
                                         r"planner-9"):
        load_config(path)


def test_text_in_the_resolved_block_is_not_a_variable(checkout: Path) -> None:
    data = user_config(device="cpu", arms=["exact-cutlass-order", "exact-triton-order"], results="results")
    planned = _planned(data, reason={"device": "explicit: $HOME is not read here", "arms": "a"})
    path = Path(run_config_path("results", planned))
    write_run_config(planned, path)
    assert load_config(path).resolution["reason"]["device"] == "explicit: $HOME is not read here"


def test_a_run_config_is_reused_for_the_config_it_was_written_for(checkout: Path) -> None:
    data = user_config()
    path = Path(run_config_path("results", data))
    write_run_config(_planned(data), path)
    assert earlier_plan(path, "results", data) == _planned(data)


def test_values_are_shortened_past_120_characters_in_messages(checkout: Path) -> None:
    for length, shown in ((120, None), (121, "... (121 characters)")):
        value = "a b" + "c" * (length - 3)
        with pytest.raises(InputError) as err:
            results_dir({"results": value}, checkout)
        message = str(err.value)
        if shown is None:
            assert f"results {value!r} is not" in message
        else:
            assert f"{value[:120]}{shown}" in message


def test_schema_messages_are_shortened_past_300_characters() -> None:
    def error(message: str) -> jsonschema.ValidationError:
        return jsonschema.ValidationError(message, validator="maxLength", validator_value=8, instance="x" * 500)

    assert cfgmod._schema_message(error("m" * 300)) == "m" * 300
    shortened = cfgmod._schema_message(error("m" * 301))
    assert shortened.startswith("x" * 120 + "... (500 characters) fails the schema's 'maxLength' rule (8)")


def test_a_config_too_deep_for_the_validator_is_refused_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def too_deep(*args: object, **kwargs: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(jsonschema, "validate", too_deep)
    with pytest.raises(InputError, match=r"^cfg\.yaml: invalid config: nested too deeply"):
        cfgmod.validate(user_config(crossmodel=["results/a", "results/deep-one"]), "cfg.yaml")

"""The machine a run is planned on: detected, or described by INT8ALIBI_HARDWARE (as tests fake it)."""

from __future__ import annotations

import json

import pytest

from int8alibi.errors import InputError
from int8alibi.hardware import ENV, Device, detect, parse

CARD = {"name": "NVIDIA GeForce RTX 4090", "total_mb": 24564, "free_mb": 23700}


def test_the_environment_describes_another_machine() -> None:
    machine = detect({ENV: json.dumps({"cores": 32, "devices": [CARD]})})
    assert machine.cores == 32 and machine.devices == (Device("NVIDIA GeForce RTX 4090", 24564, 23700),)
    assert machine.source == f"described by {ENV}"


def test_without_the_variable_this_host_is_detected() -> None:
    machine = detect({})
    assert machine.cores >= 1 and machine.source == "detected on this host"
    torch = pytest.importorskip("torch")
    assert len(machine.devices) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


@pytest.mark.parametrize("text, words", [
    ("not json", "not JSON"),
    ('{"cores": 0}', "cores must be a positive integer"),
    ('{"cores": 4, "gpus": []}', "expected an object with keys cores and devices"),
    ('{"devices": [{"name": "x", "total_mb": 10}]}', "device 0 must have exactly name"),
    ('{"devices": [{"name": "x", "total_mb": 10, "free_mb": 11}]}', "free_mb 11 above its total_mb 10"),
])
def test_a_bad_description_is_one_line_naming_the_variable(text: str, words: str) -> None:
    with pytest.raises(InputError, match=ENV) as err:
        parse(text)
    assert words in str(err.value) and "\n" not in str(err.value)

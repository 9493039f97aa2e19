"""A scoped Config: every read is checked against the keys a stage's rule digests.

Each accessor counts as reading what its value depends on: ``[]``/``get`` the key, ``exploratory``
the flag, ``resolved_device`` only ``device``, ``resolved_arms`` only ``arms``, ``resolution`` both
(the block stands for both), ``results`` the two location keys.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from int8alibi.config import Config, ReadScope
from int8alibi.errors import ConfigScopeError, Int8AlibiError

DATA = {
    "model": {"source": "synthetic"}, "size_profile": "tiny", "corpus": {"source": "synthetic"},
    "device": "auto", "arms": "auto", "exploratory": False, "results": "results",
    "resolved": {"spec": {"device": "auto", "arms": "auto"}, "device": "cpu",
                 "arms": ["exact-cutlass-order", "exact-triton-order"], "reason": {"device": "d", "arms": "a"},
                 "host": "h"},
}


def scoped(*allowed: str, free: tuple[str, ...] = ()) -> tuple[Config, ReadScope]:
    scope = ReadScope("demo", allowed, free)
    return Config(DATA, Path("run.yaml")).scoped(scope), scope


def test_each_accessor_counts_as_reading_what_its_value_depends_on() -> None:
    cfg, scope = scoped("device")
    assert cfg.resolved_device == "cpu"  # reads the resolved block, yet counts only as device
    assert cfg.device_origin == ("h", "d")  # where the device came from: device only, as well
    assert scope.read == {"device"} and not scope.undeclared
    cfg, scope = scoped("arms")
    assert cfg.resolved_arms == ["exact-cutlass-order", "exact-triton-order"]
    assert scope.read == {"arms"}
    cfg, scope = scoped("device", "arms", "exploratory", "model", "size_profile")
    assert cfg.resolution is not None and cfg.exploratory is False
    assert cfg["model"] == {"source": "synthetic"} and cfg.get("size_profile") == "tiny"
    assert scope.read == {"device", "arms", "exploratory", "model", "size_profile"}
    assert scope.unread == []


@pytest.mark.parametrize("read, key", [
    (lambda c: c["corpus"], "corpus"),
    (lambda c: c.get("corpus"), "corpus"),
    (lambda c: c.get("user_arm_time_limit_s", 600), "user_arm_time_limit_s"),
    (lambda c: c.exploratory, "exploratory"),
    (lambda c: c.resolved_arms, "arms"),
    (lambda c: c.resolution, "arms"),  # needs both; device alone is not enough
    (lambda c: c.results, "results"),
])
def test_a_key_the_rule_does_not_digest_stops_the_reader_naming_it(read, key) -> None:
    cfg, scope = scoped("device")
    with pytest.raises(ConfigScopeError, match=rf"stage demo read config key '{key}'.*int8alibi.stage_spec"):
        read(cfg)
    assert key in scope.undeclared  # kept, should the reader catch the error
    assert issubclass(ConfigScopeError, Int8AlibiError)


def test_free_keys_are_read_without_a_declaration_and_unread_lists_what_was_not_read() -> None:
    cfg, scope = scoped("device", "corpus", free=("results", "results_root", "user_arm_time_limit_s"))
    assert cfg.results == Path("results") and cfg.get("user_arm_time_limit_s") is None
    assert scope.read == {"results", "results_root", "user_arm_time_limit_s"} and not scope.undeclared
    assert scope.unread == ["corpus", "device"]


def test_an_unscoped_config_reads_anything() -> None:
    cfg = Config(DATA, Path("run.yaml"))
    assert cfg["corpus"] == {"source": "synthetic"} and cfg.resolved_device == "cpu"
    assert cfg.scope is None and cfg == Config(DATA, Path("run.yaml")).scoped(ReadScope("x", ()))

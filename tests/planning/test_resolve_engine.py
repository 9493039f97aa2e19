"""Which engine generates the determinism stage's tokens, decided once when the run is planned."""

from __future__ import annotations

import pytest

from int8alibi.planning import resolve
from int8alibi.config import Config
from int8alibi.errors import InputError

PAIR = ["vllm-cutlass", "vllm-triton"]
OWN = ["exact-cutlass-order", "exact-triton-order"]


@pytest.mark.parametrize(("spec", "arms", "importable", "engine"), [
    ("auto", PAIR, True, "vllm"),
    ("auto", PAIR[::-1], True, "vllm"),
    ("auto", PAIR, False, "own"),
    ("auto", OWN, True, "own"),
    ("auto", ["vllm-cutlass", "exact-triton-order"], True, "own"),
    ("own", PAIR, True, "own"),
    ("vllm", PAIR, True, "vllm"),
])
def test_auto_takes_vllm_exactly_for_the_pair_where_it_imports(spec: str, arms: list[str], importable: bool,
                                                                engine: str) -> None:
    chosen, reason = resolve.resolve_engine(spec, arms, importable)
    assert chosen == engine and reason.startswith("auto" if spec == "auto" else "explicit")


def test_engine_vllm_is_refused_without_the_pair_or_without_vllm() -> None:
    with pytest.raises(InputError, match="runs only the vLLM arm pair"):
        resolve.resolve_engine("vllm", OWN, True)
    with pytest.raises(InputError, match="vLLM cannot be imported on host"):
        resolve.resolve_engine("vllm", PAIR, False)
    with pytest.raises(InputError, match="expected auto, own or vllm"):
        resolve.resolve_engine("sglang", PAIR, True)


def test_the_plan_records_the_engine_and_reuses_it_only_for_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolve, "vllm_importable", lambda: True)
    config = {"device": "cuda", "arms": PAIR, "engine": "auto"}
    run = resolve.plan(config)
    block = run["resolved"]
    assert block["engine"] == "vllm" and block["spec"]["engine"] == "auto"
    assert "auto: the vLLM pair" in block["reason"]["engine"]
    assert Config(data=run, path=None).resolved_engine == "vllm"  # type: ignore[arg-type]
    monkeypatch.setattr(resolve, "vllm_importable", lambda: False)
    assert resolve.plan(config, run)["resolved"]["engine"] == "vllm"  # resolved once: the earlier plan is reused
    assert resolve.plan({**config, "engine": "own"}, run)["resolved"]["engine"] == "own"
    no_key = {"device": "cuda", "arms": PAIR}
    assert "engine" not in resolve.plan(no_key)["resolved"]["spec"]
    assert resolve.plan(no_key)["resolved"]["engine"] == "own"


def test_a_run_config_without_a_resolved_engine_is_refused(tmp_path) -> None:
    data = {"device": "cpu", "arms": OWN, "resolved": {"spec": {"device": "cpu", "arms": OWN}, "device": "cpu",
                                                        "arms": OWN, "reason": {}, "host": "h"}}
    with pytest.raises(InputError, match="no resolved engine"):
        _ = Config(data=data, path=tmp_path / "config.yaml").resolved_engine

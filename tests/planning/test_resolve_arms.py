"""A stage's arms at job time, with stand-in arms: one that is built but reports itself unavailable
on this host stops the stage naming the arm, where it was resolved and this host; the evidence a
stage records says what ran (either arm an emulation makes the pair one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from int8alibi.planning import resolve
from int8alibi.config import Config, ReadScope, load_config, validate, write_run_config
from int8alibi.errors import InputError
from int8alibi.kernels import registry

PROJECT = Path(__file__).resolve().parents[2]
# Registered arm names (so the plan's name check passes), built as stand-ins.
STAND_INS = {"exact-cutlass-order": "alpha-arm", "exact-triton-order": "beta-arm"}
PAIR = list(STAND_INS)


class StandIn:
    """An arm whose availability and emulation the test decides."""

    def __init__(self, name: str, ok: bool, emulation: bool) -> None:
        self.name, self.ok, self.is_emulation = name, ok, emulation

    def available(self) -> tuple[bool, str]:
        return (True, "here") if self.ok else (False, f"{self.name} reports no kernel on this host")

    def evidence(self) -> dict:
        return {"arm": self.name, "is_emulation": self.is_emulation}


@pytest.fixture
def arms(monkeypatch: pytest.MonkeyPatch) -> dict[str, StandIn]:
    table = {"alpha-arm": StandIn("alpha-arm", True, False), "beta-arm": StandIn("beta-arm", True, True)}
    monkeypatch.setattr(registry, "get", lambda name, device=None, **options: table[STAND_INS[name]])
    monkeypatch.setattr(resolve, "host", lambda: "node-3")
    return table


def _config(tmp: Path, planned: bool) -> object:
    data = yaml.safe_load((PROJECT / "config" / "config.yaml").read_text())
    data.update(device="cpu", arms=PAIR, results=str(tmp / "results"))
    if not planned:
        path = tmp / "plain.yaml"
        path.write_text(yaml.safe_dump(data))
        return load_config(path)
    run = resolve.plan(data)
    run["resolved"]["host"] = "planner-1"
    path = tmp / "results" / ".run" / "0123456789abcdef" / "config.yaml"
    validate(run, str(path))
    return load_config(write_run_config(run, path))


def test_an_arm_unavailable_at_job_time_stops_the_stage_naming_it_and_both_hosts(tmp_path: Path,
                                                                                arms: dict[str, StandIn]) -> None:
    cfg = _config(tmp_path, planned=True)
    arms["beta-arm"].ok = False
    with pytest.raises(InputError) as err:
        resolve.stage_arms(cfg)
    message = str(err.value)
    assert message.startswith("arm exact-triton-order on cpu (resolved on host planner-1: explicit: the config names")
    assert "cannot run on host node-3: beta-arm reports no kernel on this host; nothing is substituted" in message
    with pytest.raises(InputError, match=r"arm exact-triton-order on cpu \(resolved on host planner-1: explicit: the config "
                                         r"says device: cpu\) cannot run on host node-3"):
        resolve.require_arm(cfg, PAIR[1], torch.device("cpu"))
    assert resolve.require_arm(cfg, PAIR[0], torch.device("cpu")) is arms["alpha-arm"]


def test_without_a_run_config_the_origin_is_the_config(tmp_path: Path, arms: dict[str, StandIn]) -> None:
    cfg = _config(tmp_path, planned=False)
    arms["alpha-arm"].ok = False
    with pytest.raises(InputError, match=r"arm exact-cutlass-order on cpu \(named by the config\) cannot run on host node-3"):
        resolve.stage_arms(cfg)
    with pytest.raises(InputError, match=r"\(named by the config\) cannot run on host node-3"):
        resolve.require_arm(cfg, PAIR[0], torch.device("cpu"))


@pytest.mark.parametrize(("emulations", "expected"), [((False, True), True), ((True, False), True),
                                                      ((False, False), False), ((True, True), True)])
def test_the_evidence_calls_the_pair_an_emulation_when_either_arm_is(tmp_path: Path, arms: dict[str, StandIn],
                                                                     emulations: tuple[bool, bool],
                                                                     expected: bool) -> None:
    arms["alpha-arm"].is_emulation, arms["beta-arm"].is_emulation = emulations
    device, arm_a, arm_b, evidence = resolve.stage_arms(_config(tmp_path, planned=True))
    assert (device.type, arm_a.name, arm_b.name) == ("cpu", "alpha-arm", "beta-arm")
    assert evidence["emulation"] is expected
    assert evidence["chosen"] == PAIR and evidence["host"] == "node-3"
    assert evidence["resolved"]["host"] == "planner-1" and evidence["spec"] == PAIR
    assert evidence["arms"] == [arm_a.evidence(), arm_b.evidence()]


def test_a_cuda_run_on_a_host_without_one_names_the_arms(tmp_path: Path, arms: dict[str, StandIn],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    data = yaml.safe_load((PROJECT / "config" / "config.yaml").read_text())
    data.update(device="cuda", arms=PAIR, results=str(tmp_path / "results"))
    path = tmp_path / "cuda.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = load_config(path)
    with pytest.raises(InputError, match=r"^arms exact-cutlass-order, exact-triton-order on device cuda \(named by the config\) "
                                         r"cannot run on host node-3: no CUDA device"):
        resolve.stage_arms(cfg)
    with pytest.raises(InputError, match=r"^arm exact-cutlass-order on device cuda "):
        resolve.stage_device(cfg, PAIR[:1])
    with pytest.raises(InputError, match=r"^device cuda \(named by the config\)"):
        resolve.stage_device(cfg)


def test_a_stage_that_reads_only_the_device_is_refused_naming_where_the_device_was_resolved(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """requant reads device, not arms: its refusal on a host without CUDA says where the run's device was
    resolved, and reads no key its rule does not digest (the scope would turn the refusal into another)."""
    data = {"device": "auto", "arms": "auto",
            "resolved": {"spec": {"device": "auto", "arms": "auto"}, "device": "cuda", "arms": list(PAIR),
                         "reason": {"device": "a CUDA device was visible", "arms": "best pair"}, "host": "gpu-7"}}
    scope = ReadScope("requant", ("device",), ())
    cfg = Config(data, Path("run.yaml")).scoped(scope)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match=r"^device cuda \(resolved on host gpu-7: a CUDA device was visible\) "
                                         r"cannot run on host "):
        resolve.stage_device(cfg)
    assert scope.read == {"device"} and not scope.undeclared


def test_a_plan_is_reused_only_for_the_same_device_and_arms(tmp_path: Path, arms: dict[str, StandIn]) -> None:
    data = yaml.safe_load((PROJECT / "config" / "config.yaml").read_text())
    data.update(device="cpu", arms=PAIR)
    earlier = resolve.plan(data)
    earlier["resolved"]["host"] = "planner-1"
    assert resolve.plan(data, earlier)["resolved"]["host"] == "planner-1"
    other = dict(data, arms=PAIR[::-1])
    assert resolve.plan(other, earlier)["resolved"]["host"] == "node-3"
    assert resolve.plan(dict(data, device="cuda"), earlier)["resolved"]["host"] == "node-3"
    assert resolve.plan(data, {"resolved": "not a block"})["resolved"]["host"] == "node-3"


def test_auto_arms_that_cannot_be_chosen_here_are_named_with_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    def nothing_available(spec, device):  # type: ignore[no-untyped-def]
        raise InputError("no pair of arms is available on cuda")

    monkeypatch.setattr(registry, "select", nothing_available)
    monkeypatch.setattr(resolve, "host", lambda: "node-3")
    data = yaml.safe_load((PROJECT / "config" / "config.yaml").read_text())
    data.update(device="cuda", arms="auto")
    with pytest.raises(InputError, match=r"^arms: auto cannot be resolved on host node-3 \(explicit: the config says "
                                         r"device: cuda\): no pair of arms is available on cuda"):
        resolve.plan(data)

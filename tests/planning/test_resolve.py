"""Resolve once: device and arms are decided when a run is planned, written into the run config with
the reason and the host, reused by later plans, and read (never re-resolved) by every stage; a stage
whose resolved arm cannot run where it executes fails closed, naming the arm and the host."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from int8alibi.planning import resolve
from int8alibi.config import RESOLVED, expand_env, load_config, validate
from int8alibi.config import write_run_config as write_once
from int8alibi.errors import InputError
from int8alibi.kernels import registry
from int8alibi.stages import capture, prediction

PROJECT = Path(__file__).resolve().parents[2]
EXACT = ["exact-cutlass-order", "exact-triton-order"]


def user_config(tmp: Path, **overrides) -> dict:
    data = yaml.safe_load((PROJECT / "config" / "config.yaml").read_text())
    data.update(model={"source": "synthetic", "synthetic": {"preset": "tiny", "seed": 0}}, size_profile="tiny",
                corpus={"source": "synthetic", "path": None}, results=str(tmp / "results"), **overrides)
    return data


def write_run_config(tmp: Path, run: dict) -> Path:
    path = tmp / "results" / ".run" / "0123456789abcdef" / "config.yaml"
    validate(run, str(path))
    return write_once(run, path)


class FakeGpuArm:
    """Stands for a real kernel that is available wherever torch sees a CUDA device."""

    is_emulation = False

    def __init__(self, name: str, device: torch.device) -> None:
        self.name, self.device = name, device

    def available(self) -> tuple[bool, str]:
        return (True, "fake GPU kernel") if torch.cuda.is_available() else (False, "no CUDA GPU visible to torch")

    def evidence(self) -> dict:
        return {"arm": self.name, "is_emulation": False}


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):
    """A host where torch sees a CUDA device and cublaslt/triton are available (vLLM is not)."""
    real_get = registry.get

    def get(name, device=None):
        if name in ("cublaslt", "triton"):
            return FakeGpuArm(name, torch.device(device))
        return real_get(name, device)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(registry, "get", get)
    monkeypatch.setattr(resolve, "host", lambda: "gpu-node-7")
    yield
    monkeypatch.undo()


def test_auto_on_a_cpu_host_resolves_to_the_exact_pair_with_reason_and_host(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = resolve.plan(user_config(tmp_path, device="auto", arms="auto"))
    block = run[RESOLVED]
    assert block["device"] == "cpu" and block["arms"] == EXACT
    assert block["host"] == resolve.host()
    assert f"no CUDA device visible to torch on host {resolve.host()}" in block["reason"]["device"]
    assert "auto" in block["reason"]["arms"] and set(block["unavailable"]) >= {"cublaslt", "triton"}
    assert block["spec"] == {"device": "auto", "arms": "auto"}
    cfg = load_config(write_run_config(tmp_path, run))
    assert cfg.resolved_device == "cpu" and cfg.resolved_arms == EXACT


def test_a_later_plan_reads_the_resolution_instead_of_making_its_own(tmp_path: Path, fake_gpu) -> None:
    """A cluster job re-parses the Snakefile on another host: the run config's block is reused."""
    earlier = {**user_config(tmp_path, device="auto", arms="auto"),
               RESOLVED: {"spec": {"device": "auto", "arms": "auto"}, "device": "cpu", "arms": EXACT,
                          "engine": "own",
                          "reason": {"device": "auto: no CUDA device visible to torch on host login1",
                                     "arms": "auto: ...", "engine": "auto: ..."}, "host": "login1",
                          "unavailable": {}}}
    again = resolve.plan(user_config(tmp_path, device="auto", arms="auto"), earlier)
    assert again[RESOLVED] == earlier[RESOLVED]  # not re-resolved on the GPU host
    # a different device/arms value is a different run: resolved afresh, here
    other = resolve.plan(user_config(tmp_path, device="cuda", arms="auto"), earlier)
    assert other[RESOLVED]["host"] == "gpu-node-7" and other[RESOLVED]["device"] == "cuda"


def test_resolved_on_a_gpu_host_then_run_without_one_fails_closed_naming_arm_and_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_gpu) -> None:
    run = resolve.plan(user_config(tmp_path, device="auto", arms="auto"))
    block = run[RESOLVED]
    assert block["device"] == "cuda" and block["arms"] == ["cublaslt", "triton"]
    assert "a CUDA device is visible to torch on host gpu-node-7" in block["reason"]["device"]
    path = write_run_config(tmp_path, run)
    monkeypatch.undo()  # the stage now executes on this host, which has no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = load_config(path)
    here = resolve.host()
    # an arm stage: capture stops before loading anything
    with pytest.raises(InputError) as err:
        capture.run(cfg, tmp_path / "capture", gate=tmp_path / "no-gate.parquet", project_root=PROJECT)
    message = str(err.value)
    assert "cublaslt" in message and f"host {here}" in message and "gpu-node-7" in message
    assert not (tmp_path / "capture" / "manifest.json").exists()
    # a device-only stage: prediction names the device and the host
    with pytest.raises(InputError, match=f"device cuda .*cannot run on host {here}"):
        prediction.run(cfg, tmp_path / "prediction", index=tmp_path / "no-index.parquet", project_root=PROJECT)


def test_an_arm_resolved_elsewhere_that_is_missing_here_fails_closed(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The device exists here but the arm does not (e.g. Triton not installed on this node)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = resolve.plan(user_config(tmp_path, device="cpu", arms=["exact-cutlass-order", "triton"]))
    cfg = load_config(write_run_config(tmp_path, run))
    with pytest.raises(InputError, match=rf"arm triton on cpu .*cannot run on host {resolve.host()}"):
        resolve.stage_arms(cfg)


def test_explicit_device_and_arms_work_unchanged_with_or_without_a_run_config(tmp_path: Path) -> None:
    data = user_config(tmp_path, device="cpu", arms=EXACT)
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(data))
    for cfg in (load_config(plain), load_config(write_run_config(tmp_path, resolve.plan(data)))):
        assert cfg.resolved_device == "cpu" and cfg.resolved_arms == EXACT
        device, arm_a, arm_b, evidence = resolve.stage_arms(cfg)
        assert device.type == "cpu" and [arm_a.name, arm_b.name] == EXACT and evidence["chosen"] == EXACT
        assert evidence["emulation"] is True


def test_auto_without_a_resolution_is_refused_not_resolved(tmp_path: Path) -> None:
    plain = tmp_path / "auto.yaml"
    plain.write_text(yaml.safe_dump(user_config(tmp_path, device="auto", arms="auto")))
    cfg = load_config(plain)
    with pytest.raises(InputError, match="resolved once per run"):
        _ = cfg.resolved_device
    with pytest.raises(InputError, match="resolved once per run"):
        resolve.stage_arms(cfg)


def test_a_resolution_for_other_values_is_refused(tmp_path: Path) -> None:
    run = resolve.plan(user_config(tmp_path, device="cpu", arms=EXACT))
    path = write_run_config(tmp_path, run)
    cfg = load_config(path, ["device=cuda"])
    with pytest.raises(InputError, match="planned for device 'cpu'"):
        _ = cfg.resolved_device


def test_a_user_config_may_not_carry_a_resolved_block(tmp_path: Path) -> None:
    run = resolve.plan(user_config(tmp_path, device="cpu", arms=EXACT))
    with pytest.raises(InputError, match="written by the pipeline"):
        resolve.plan(run)


def test_environment_variables_expand_before_planning_and_an_unset_one_fails_closed_in_the_stage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = user_config(tmp_path, device="cpu", arms=EXACT)
    data["model"] = {"source": "hf", "parent": "${INT8ALIBI_TEST_PARENT}/model", "checkpoint": None}
    monkeypatch.setenv("INT8ALIBI_TEST_PARENT", "/models")
    expanded, unset = expand_env(data)
    assert expanded["model"]["parent"] == "/models/model" and unset == []
    monkeypatch.delenv("INT8ALIBI_TEST_PARENT")
    expanded, unset = expand_env(data)
    assert expanded["model"]["parent"] == "${INT8ALIBI_TEST_PARENT}/model"
    assert unset == ["model.parent: ${INT8ALIBI_TEST_PARENT}"]
    path = write_run_config(tmp_path, resolve.plan(expanded))
    # set now, on the executing host: still refused (the run was planned without it)
    monkeypatch.setenv("INT8ALIBI_TEST_PARENT", "/elsewhere")
    with pytest.raises(InputError, match=r"model.parent: \$\{INT8ALIBI_TEST_PARENT\} was not expanded.*set it and run "
                                         "snakemake again"):
        load_config(path)


@pytest.mark.parametrize(("arms", "why"), [
    (["exact-cutlass-order", "exact-cutlass-order"], "names the same arm twice"),
    (["nonexistent", "triton"], "unknown kernel arm 'nonexistent'"),
    (["mod:", "triton"], "unknown kernel arm 'mod:'"),
    ([":fn", "triton"], "unknown kernel arm ':fn'"),
])
def test_an_explicit_pair_is_checked_by_name_when_planned(arms: list[str], why: str) -> None:
    with pytest.raises(InputError, match=why):
        resolve.plan({"device": "cpu", "arms": arms})
    assert resolve.plan({"device": "cpu", "arms": ["exact-triton-order", "mymodule:my_mm"]})["resolved"]["arms"] == [
        "exact-triton-order", "mymodule:my_mm"]  # a user arm is named, not imported, when planned

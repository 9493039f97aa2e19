"""The devices a CUDA run's GPU jobs spread over are resolved once at plan time (``gpus``), named as
CUDA_VISIBLE_DEVICES names them; the budget is the least free memory among them and Snakemake's
gpu_mem_mb limit is the budget times their number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from int8alibi.config import RESOLVED, validate
from int8alibi.errors import InputError
from int8alibi.hardware import ENV, Device, Hardware
from int8alibi.planning import resolve
from int8alibi.planning.resources import device_count, device_limit

from .test_resolve import EXACT, user_config

H100 = "NVIDIA H100 80GB HBM3"


def machine(*free_mb: int, name: str = H100) -> Hardware:
    return Hardware(32, tuple(Device(name, 81559, free) for free in free_mb), "faked")


def fake(*free_mb: int) -> str:
    return json.dumps({"cores": 32, "devices": [{"name": H100, "total_mb": 81559, "free_mb": f} for f in free_mb]})


@pytest.mark.parametrize("count", [1, 2, 4])
def test_auto_is_every_visible_device_numbered_from_0_without_cuda_visible_devices(count: int) -> None:
    got = resolve.resolve_gpus("auto", "cuda", machine(*[80000] * count), env={})
    assert got["devices"] == [str(i) for i in range(count)]
    assert f"the {count} {H100} device(s)" in got["reason"] and "CUDA_VISIBLE_DEVICES not set" in got["reason"]


@pytest.mark.parametrize("count", [1, 2, 4])
def test_auto_takes_the_planning_process_s_cuda_visible_devices_names(count: int) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"[: 2 * count - 1]}
    got = resolve.resolve_gpus("auto", "cuda", machine(*[80000] * count), env=env)
    assert got["devices"] == ["4", "5", "6", "7"][:count] and "as CUDA_VISIBLE_DEVICES names them" in got["reason"]


def test_uuids_in_cuda_visible_devices_are_kept_as_names() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "GPU-1a2b, GPU-3c4d"}
    assert resolve.resolve_gpus("auto", "cuda", machine(80000, 80000), env=env)["devices"] == ["GPU-1a2b", "GPU-3c4d"]


def test_a_cuda_visible_devices_naming_fewer_devices_than_seen_is_refused() -> None:
    with pytest.raises(InputError, match=r"names 1 devices, but 2 are visible"):
        resolve.resolve_gpus("auto", "cuda", machine(80000, 80000), env={"CUDA_VISIBLE_DEVICES": "3"})


def test_cards_of_another_model_than_the_first_are_left_out_saying_so() -> None:
    mixed = Hardware(8, (Device(H100, 81559, 80000), Device("NVIDIA A100-SXM4-80GB", 81920, 80000),
                         Device(H100, 81559, 70000)), "faked")
    got = resolve.resolve_gpus("auto", "cuda", mixed, env={})
    assert got["devices"] == ["0", "2"] and "left out, another model than" in got["reason"]
    assert "1 (NVIDIA A100-SXM4-80GB)" in got["reason"]


def test_an_explicit_list_is_taken_as_given_as_names() -> None:
    got = resolve.resolve_gpus([1, "GPU-3c4d"], "cuda", machine(), env={})
    assert got == {"spec": [1, "GPU-3c4d"], "devices": ["1", "GPU-3c4d"],
                   "reason": "explicit: the config says gpus: ['1', 'GPU-3c4d']"}
    with pytest.raises(InputError, match="names a device twice"):
        resolve.resolve_gpus([1, "1"], "cuda", machine(), env={})


def test_a_cpu_run_has_none_and_a_cuda_run_planned_without_a_gpu_leaves_them_to_the_scheduler() -> None:
    assert resolve.resolve_gpus("auto", "cpu", machine(80000)) == {
        "spec": "auto", "devices": [], "reason": "not applicable: device cpu"}
    login = resolve.resolve_gpus("auto", "cuda", Hardware(4, (), "faked"), env={})
    assert login["devices"] == [] and "the scheduler assigns each job its device" in login["reason"]


def test_the_auto_budget_is_the_least_free_memory_among_the_run_s_devices() -> None:
    four = machine(80000, 61000, 79000, 60999)
    got = resolve.resolve_budget("auto", "cuda", four, gpus=["0", "1", "2", "3"], env={})
    assert got["mb"] == 60999 and "smallest free memory among the run's 4 CUDA devices" in got["reason"]
    assert "device 3's" in got["reason"]
    assert resolve.resolve_budget("auto", "cuda", four, gpus=["0", "2"], env={})["mb"] == 79000
    one = resolve.resolve_budget("auto", "cuda", four, env={})  # no devices named: device 0, as before
    assert one["mb"] == 80000 and "the free memory of CUDA device 0" in one["reason"]


def test_the_budget_of_devices_named_by_cuda_visible_devices_reads_the_matching_device() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "6,7"}
    assert resolve.resolve_budget("auto", "cuda", machine(50000, 40000), gpus=["7"], env=env)["mb"] == 40000
    with pytest.raises(InputError, match=r"device\(s\) \['0'\] of gpus are not visible"):
        resolve.resolve_budget("auto", "cuda", machine(50000, 40000), gpus=["0"], env=env)


@pytest.mark.parametrize("count", [1, 2, 4])
def test_the_plan_records_the_devices_and_the_limit_is_the_budget_times_their_number(
        count: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, fake(*[70000 + i for i in range(count)]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run = resolve.plan(user_config(tmp_path, device="cuda", arms=EXACT))
    validate(run, "run config")
    assert run[RESOLVED]["gpus"]["devices"] == [str(i) for i in range(count)]
    assert run[RESOLVED]["gpu_budget"]["mb"] == 70000
    assert device_count(run) == count
    assert device_limit(None, run) == 70000 * count
    assert device_limit(50000, run) == 50000  # a limit given on the command line wins


def test_the_devices_are_reused_for_the_same_value_and_resolved_anew_for_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(ENV, fake(80000, 70000))
    config = user_config(tmp_path, device="cuda", arms=EXACT)
    run = resolve.plan(config)
    monkeypatch.setenv(ENV, fake(10000, 10000, 10000, 10000))
    again = resolve.plan({**config, "size_profile": "default-cpu"}, run)[RESOLVED]
    assert again["gpus"] == run[RESOLVED]["gpus"] and again["gpu_budget"]["mb"] == 70000  # decided once
    named = resolve.plan({**config, "gpus": [2, 3]}, run)[RESOLVED]
    assert named["gpus"]["devices"] == ["2", "3"] and named["gpu_budget"]["mb"] == 10000  # the budget follows


def test_a_cpu_run_records_no_devices_and_has_no_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, fake(80000, 80000))
    run = resolve.plan(user_config(tmp_path, device="cpu", arms=EXACT))
    assert run[RESOLVED]["gpus"]["devices"] == [] and device_limit(None, run) is None


def test_a_run_config_written_before_devices_is_kept_as_written_and_counts_one_device(tmp_path: Path) -> None:
    config = user_config(tmp_path, device="cpu", arms=EXACT)
    earlier = resolve.plan(config)
    old = {**earlier, RESOLVED: {k: v for k, v in earlier[RESOLVED].items() if k != "gpus"}}
    assert resolve.plan(config, old) == old
    cuda = {**old, RESOLVED: {**old[RESOLVED], "device": "cuda", "gpu_budget": {"spec": 9000, "mb": 9000,
                                                                               "reason": "named"}}}
    assert device_count(cuda) == 1 and device_limit(None, cuda) == 9000

"""A GPU job of a CUDA run with several devices claims one before CUDA starts and runs with
CUDA_VISIBLE_DEVICES set to it: claims spread over the devices by memory left, a claim that does not
fit waits for one to end, a killed claimant's claim is reclaimed, a scheduler's assignment is kept,
and a process that already initialised CUDA is refused. Faked devices, on the CPU."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from int8alibi import hardware
from int8alibi.config import write_run_config
from int8alibi.errors import InputError
from int8alibi.planning import resolve
from int8alibi.provenance import environment
from int8alibi.runtime import gpu_slots
from int8alibi.runtime.runner import stage_main

ROOT = Path(__file__).resolve().parents[2]
FOUR = ["0", "1", "2", "3"]

HOLDER = """
import sys
from pathlib import Path
from int8alibi.runtime.gpu_slots import claim
slot = claim(Path(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]), timeout_s=30, poll_s=0.05)
print(slot.device, flush=True)
sys.stdin.read()  # held until the test closes stdin or kills this process
"""


class Holder:
    """Another process holding a claim, as another GPU job does."""

    def __init__(self, folder: Path, devices: list[str], budget: int, need: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "workflow")}
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), ",".join(devices), str(budget),
                                      str(need)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        self.device = self.proc.stdout.readline().strip()
        assert self.device, "the holder claimed nothing"

    def end(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


@pytest.fixture
def holders():
    started: list[Holder] = []
    yield started
    for holder in started:
        if holder.proc.poll() is None:
            holder.kill()


def test_pick_takes_the_most_left_the_lowest_index_on_a_tie_and_an_exact_fit() -> None:
    assert gpu_slots.pick(FOUR, 1000, 400, {}) == "0"  # a tie: the lowest index
    assert gpu_slots.pick(FOUR, 1000, 400, {"0": 100, "1": 50, "2": 100, "3": 50}) == "1"
    assert gpu_slots.pick(["0", "1"], 1000, 300, {"0": 700, "1": 701}) == "0"  # exactly what is left fits
    assert gpu_slots.pick(["0", "1"], 1000, 301, {"0": 700, "1": 701}) is None  # one MiB more does not
    assert gpu_slots.pick(["0", "1"], None, 10**9, {"0": 5, "1": 3}) == "1"  # no budget: the least claimed


def test_concurrent_claims_of_other_processes_spread_over_the_devices_by_memory(tmp_path: Path, holders) -> None:
    folder = tmp_path / "gpus"
    for need in (600, 600, 300, 300):
        holders.append(Holder(folder, FOUR, 1000, need))
    assert [h.device for h in holders] == ["0", "1", "2", "3"]  # each took an empty device
    holders.append(Holder(folder, FOUR, 1000, 400))  # 400 left on 0 and 1, 700 on 2 and 3
    assert holders[-1].device == "2"
    assert gpu_slots.claimed_mb(folder) == {"0": 600, "1": 600, "2": 700, "3": 300}
    mine = gpu_slots.claim(folder, FOUR, 1000, 700, timeout_s=5, poll_s=0.05)
    assert mine.device == "3"
    mine.release()
    assert not mine.path.exists()


def test_a_claim_that_does_not_fit_waits_until_another_releases(tmp_path: Path, holders,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "gpus"
    holders.extend(Holder(folder, ["0", "1"], 1000, need) for need in (800, 700))
    with pytest.raises(InputError, match=r"no device of \['0', '1'\] had 301 MiB left"):
        gpu_slots.claim(folder, ["0", "1"], 1000, 301, timeout_s=0.3, poll_s=0.05)
    releaser = threading.Timer(0.5, holders[0].end)
    releaser.start()
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="int8alibi"):
        slot = gpu_slots.claim(folder, ["0", "1"], 1000, 301, timeout_s=20, poll_s=0.05, log_every_s=0.2)
    releaser.join()
    assert slot.device == "0" and time.monotonic() - started >= 0.4
    assert "waiting" in caplog.text and "for 301 MiB on one of devices 0, 1" in caplog.text
    slot.release()


def test_a_killed_claimant_s_claim_is_reclaimed_and_its_file_removed(tmp_path: Path, holders) -> None:
    folder = tmp_path / "gpus"
    holders.append(Holder(folder, ["0"], 1000, 1000))
    files = list(folder.glob("*.claim"))
    assert len(files) == 1 and gpu_slots.claimed_mb(folder) == {"0": 1000}
    holders[0].kill()
    slot = gpu_slots.claim(folder, ["0"], 1000, 1000, timeout_s=5, poll_s=0.05)
    assert slot.device == "0" and not files[0].exists()
    slot.release()


def test_a_need_above_the_budget_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="a job of 1001 MiB cannot fit one device of the run's budget 1000 MiB"):
        gpu_slots.claim(tmp_path, FOUR, 1000, 1001)


def run_config(devices: list[str], budget: int | None = 1000, device: str = "cuda") -> dict[str, Any]:
    return {"resolved": {"device": device, "gpus": {"spec": "auto", "devices": devices, "reason": "faked"},
                         "gpu_budget": {"spec": "auto", "mb": budget, "reason": "faked"}}}


def config_path(tmp_path: Path) -> Path:
    return tmp_path / "results" / ".run" / "0123456789abcdef" / "config.yaml"


def test_place_pins_the_job_and_holds_its_claim_under_the_run_s_folder(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    env: dict[str, str] = {}
    with caplog.at_level(logging.INFO, logger="int8alibi"):
        first = gpu_slots.place(run_config(["4", "5"]), config_path(tmp_path), 700, env=env)
        second = gpu_slots.place(run_config(["4", "5"]), config_path(tmp_path), 700, env={})  # another job
    assert first is not None and second is not None
    assert env == {"CUDA_VISIBLE_DEVICES": "4"} and second.device == "5"
    assert first.path.parent == tmp_path / "results" / ".run" / "gpus" / gpu_slots.host()
    assert "gpu: device 4 (700 MiB claimed, of a budget of 1000 MiB per device; devices 4,5)" in caplog.text
    first.release()
    second.release()


def test_a_scheduler_s_assignment_is_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2"}
    with caplog.at_level(logging.INFO, logger="int8alibi"):
        assert gpu_slots.place(run_config(FOUR), config_path(tmp_path), 700, env=env) is None
    assert env == {"CUDA_VISIBLE_DEVICES": "2"} and "assigned by the environment" in caplog.text
    assert not (tmp_path / "results" / ".run" / "gpus").exists()
    same = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}  # the run's own devices, inherited from Snakemake: pinned
    slot = gpu_slots.place(run_config(FOUR), config_path(tmp_path), 700, env=same)
    assert slot is not None and same == {"CUDA_VISIBLE_DEVICES": "0"}
    slot.release()


def test_one_device_is_set_without_a_claim_and_a_cpu_run_or_a_cpu_job_is_left_alone(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    assert gpu_slots.place(run_config(["3"]), config_path(tmp_path), 700, env=env) is None
    assert env == {"CUDA_VISIBLE_DEVICES": "3"} and not (tmp_path / "results").exists()
    for cfg, need in ((run_config([], device="cpu"), 0), (run_config(FOUR), None), (run_config([]), 700)):
        untouched: dict[str, str] = {}
        assert gpu_slots.place(cfg, config_path(tmp_path), need, env=untouched) is None and untouched == {}


def test_a_process_that_initialised_cuda_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    env: dict[str, str] = {}
    with pytest.raises(InputError, match="CUDA was initialised before the job was pinned"):
        gpu_slots.place(run_config(FOUR), config_path(tmp_path), 700, env=env)
    assert env == {}


def records_the_device(cfg: object, out_dir: Path) -> None:
    """A stage that writes what a manifest records of its environment."""
    (out_dir / "env.json").write_text(json.dumps(environment.collect("cpu", ROOT)["env"]))


def test_the_runner_pins_a_gpu_job_and_its_manifest_records_the_device(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    card = {"name": "NVIDIA H100 80GB HBM3", "total_mb": 81559, "free_mb": 1000}
    monkeypatch.setenv(hardware.ENV, json.dumps({"cores": 4, "devices": [card, card]}))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # restored after the test: the runner sets it
    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    run = resolve.plan({**data, "device": "cuda", "arms": ["exact-cutlass-order", "exact-triton-order"]})
    assert run["resolved"]["gpus"]["devices"] == ["0", "1"] and run["resolved"]["gpu_budget"]["mb"] == 1000
    path = write_run_config(run, config_path(tmp_path))
    folder = gpu_slots.claims_folder(path)
    other = gpu_slots.claim(folder, ["0", "1"], 1000, 600)  # another job on device 0
    out = tmp_path / "results" / "stage"
    assert stage_main(records_the_device, ["--config", str(path), "--out", str(out), "--gpu-mem-mb", "500"]) == 0
    assert json.loads((out / "env.json").read_text())["CUDA_VISIBLE_DEVICES"] == "1"
    assert gpu_slots.claimed_mb(folder) == {"0": 600}  # the stage's claim ended with it
    other.release()

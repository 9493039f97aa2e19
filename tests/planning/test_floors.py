"""Stage floors: hand-counted work at hand-picked rates."""

from __future__ import annotations

import pytest

from int8alibi.planning import floors
from int8alibi.errors import InputError
from int8alibi.planning.floors import Rates, Work, Workload, stage_work
from int8alibi.model.size import ModelSize
from int8alibi.protocol import load
from int8alibi.engines import generation
from int8alibi.quant.variants import CHECKPOINT_VARIANTS

SIZE = ModelSize(blocks=1, hidden=16, intermediate=32, heads=2, kv_heads=1, head_dim=8, vocab=64, tied=True)
LOAD = Workload(prefill_tokens=4, prompts=2, new_tokens=3, windows=2, window_tokens=8, replay_windows=1,
                replay_window_tokens=8, cells_per_layer=42)
RATES = Rates(device_bw=1e5, device_flops=1e6, host_bw=1e4, host_flops=1e5, link=1e4, disk_read=1e4, disk_write=1e3)
P, Q, FWD = 6752, 4960, 6656  # parent and checkpoint bytes, FLOPs per token (test_model_size counts them)


def test_generate_floor_is_its_transfers():
    work = stage_work(SIZE, LOAD)["generate"]
    # 16 jobs of 2 prompts x 3 new tokens: each job moves one checkpoint, each step streams it
    assert work == Work(disk_read=P + 4 * Q, disk_write=0, transfer=16 * Q, memory=16 * 6 * Q, flops=16 * 6 * FWD)
    assert work.terms(RATES) == pytest.approx({"disk read": 2.6592, "disk write": 0.0, "transfer": 7.936,
                                               "memory": 4.7616, "compute": 0.638976})
    assert work.seconds(RATES) == pytest.approx(7.936) and work.limit(RATES) == "transfer"


def test_model_floor_is_on_the_host_and_its_disk_write():
    work = stage_work(SIZE, LOAD)["model"]
    assert work.on_host and work.flops == 2 * 32 * FWD
    # read 0.6752 s, write 6.752 s, host memory 1.3504 s, host compute 4.25984 s; no transfer
    assert work.seconds(RATES) == pytest.approx(6.752) and work.limit(RATES) == "disk write"


def test_faults_floor_counts_every_cell_of_every_layer():
    work = stage_work(SIZE, LOAD)["faults"]
    operands = 2304 + 4 * 128 + 4 * 128 + 4 * 4 * 7  # int8 weights, scales, 4 tokens' activations and scales
    assert work.disk_read == operands and work.memory == 42 * operands
    assert work.flops == 42 * 2 * 4 * 2304


def test_rates_must_be_positive():
    with pytest.raises(InputError, match="link=0"):
        Rates(device_bw=1, device_flops=1, host_bw=1, host_flops=1, link=0, disk_read=1, disk_write=1)


def test_workload_from_the_protocol_and_the_stage_constants():
    from int8alibi.engines import perplexity
    from int8alibi.stages import capture

    protocol = load()
    w = Workload.from_protocol(protocol.analysis, protocol.tokens, protocol.faults, "study")
    assert (w.prefill_tokens, w.prompts, w.new_tokens, w.windows, w.window_tokens) == (512, 8, 64, 40, 2048)
    assert w.cells_per_layer == protocol.faults["cells_per_layer"]
    with pytest.raises(InputError, match="size profile 'huge'"):
        Workload.from_protocol(protocol.analysis, protocol.tokens, protocol.faults, "huge")
    assert floors.CHECKPOINTS == len(CHECKPOINT_VARIANTS)
    assert floors.CAPTURED_CHECKPOINTS == len(capture.CHECKPOINTS) and len(capture.PHASES) == 2
    assert floors.GENERATE_RUNS == len(generation.RUNS) and floors.PERPLEXITY_MODELS == len(perplexity.MODELS)

"""Resources from the model: requests follow the parent's size; a 14B parent gets 14B requests."""

from __future__ import annotations

import math

import pytest

from int8alibi.planning import resources
from int8alibi.errors import Int8AlibiError
from int8alibi.planning.floors import RATES, Workload, stage_work
from int8alibi.model.size import model_size
from int8alibi.protocol import load

GIB = 1 << 30


def _size(preset: str):
    return model_size({"source": "synthetic", "synthetic": {"preset": preset}})


def _study() -> Workload:
    p = load()
    return Workload.from_protocol(p.analysis, p.tokens, p.faults, "study")


def test_memory_is_the_held_bytes_plus_overhead_with_headroom_in_whole_gib():
    size, work = _size("qwen3-14b"), _study()
    r = resources.rule_resources("requant", size, work, "cuda")
    held = size.parent_bytes + 2 * size.checkpoint_bytes
    assert r.mem_mb == 1024 * math.ceil(math.ceil(1.2 * (3 * GIB + held) / 2**20) / 1024)
    assert r.mem_mb * 2**20 >= 1.2 * (size.parent_bytes + 2 * size.checkpoint_bytes)
    floor = stage_work(size, work)["requant"].seconds(RATES["h200"])
    assert r.runtime == 10 + math.ceil(1000 * floor / 60)


def test_a_14b_parent_gets_requests_that_hold_it():
    size, work = _size("qwen3-14b"), _study()
    assert size.parent_bytes == pytest.approx(29.54e9, rel=1e-3)
    plan = {rule: resources.rule_resources(rule, size, work, "cuda") for rule in resources.RULE_STAGE}
    for rule in ("model", "reference_checkpoint", "requant", "capture", "generate", "prefill_decode",
                 "perplexity", "tokens"):
        assert plan[rule].mem_mb * 2**20 > size.parent_bytes + size.checkpoint_bytes, rule
        assert plan[rule].mem_mb < 128_000, rule  # a 128 GB node
    assert plan["model"].mem_mb * 2**20 > 2.6 * size.parent_bytes  # as measured for the model stage
    small = {rule: resources.rule_resources(rule, _size("qwen3-1.7b"), work, "cuda") for rule in resources.RULE_STAGE}
    assert all(small[r].mem_mb <= plan[r].mem_mb and small[r].runtime <= plan[r].runtime for r in plan)


def test_generate_and_shards_request_their_share_of_the_stage():
    size, work = _size("qwen3-8b"), _study()
    stage = stage_work(size, work)
    gen = resources.rule_resources("generate", size, work, "cuda")
    assert gen.runtime == 10 + math.ceil(1000 * stage["generate"].seconds(RATES["h200"]) / 16 / 60)
    one = resources.rule_resources("faults_shard", size, work, "cpu", faults_shards=1)
    eight = resources.rule_resources("faults_shard", size, work, "cpu", faults_shards=8)
    assert eight.runtime < one.runtime and eight.mem_mb == one.mem_mb


def test_plan_uses_the_resolved_device_and_falls_back_when_the_parent_is_unknown():
    protocol = load()
    run = {"model": {"source": "synthetic", "synthetic": {"preset": "qwen3-1.7b"}}, "size_profile": "study",
           "device": "auto", "resolved": {"device": "cuda"}}
    plan = resources.plan_resources(run, protocol)
    assert plan["perplexity"] == resources.rule_resources("perplexity", _size("qwen3-1.7b"), _study(), "cuda")
    unknown = resources.plan_resources({**run, "model": {"source": "hf", "parent": "${UNSET}"}}, protocol)
    assert set(unknown.values()) == {resources.Resources(16000, 120, resources.WHOLE_DEVICE_MB)}
    with pytest.raises(Int8AlibiError, match="no estimate for rule 'report'"):
        resources.rule_resources("report", _size("tiny"), _study(), "cpu")


def test_forward_pass_jobs_share_the_device_by_what_they_hold_and_the_rest_take_all_of_it():
    size, work = _size("qwen3-14b"), _study()
    gen = resources.rule_resources("generate", size, work, "cuda")
    held = size.parent_bytes + size.checkpoint_bytes
    assert gen.gpu_mem_mb == 1024 * math.ceil(math.ceil(1.2 * (GIB + held) / 2**20) / 1024)
    assert 2 * gen.gpu_mem_mb < 139_000 < 4 * gen.gpu_mem_mb  # an H200 runs two 14B generate jobs at once
    small = resources.rule_resources("generate", _size("qwen3-1.7b"), work, "cuda")
    assert 8 * small.gpu_mem_mb <= 130_000  # and eight at 1.7B
    for rule in ("capture", "compare", "faults", "requant", "prediction"):
        assert resources.rule_resources(rule, size, work, "cuda").gpu_mem_mb == resources.WHOLE_DEVICE_MB
    assert all(resources.rule_resources(r, size, work, "cpu").gpu_mem_mb == 0 for r in resources.RULE_STAGE)

"""Resources from the model: requests follow the parent's size; a 14B parent gets 14B requests."""

from __future__ import annotations

import math

import pytest

from int8alibi.planning import resources
from int8alibi.errors import InputError, Int8AlibiError
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


def test_every_gpu_job_shares_the_device_by_what_it_holds():
    size, work = _size("qwen3-14b"), _study()
    gen = resources.rule_resources("generate", size, work, "cuda")
    held = size.checkpoint_bytes  # a W8A8 engine on the device: the checkpoint, never the bf16 projections too
    assert resources.device_held_bytes("generate", size, work) == held < resources.held_bytes("generate", size, work)
    assert gen.gpu_mem_mb == 1024 * math.ceil(math.ceil(1.2 * (GIB + held) / 2**20) / 1024)
    assert 6 * gen.gpu_mem_mb < 139_000 < 7 * gen.gpu_mem_mb  # an H200 runs six 14B generate jobs at once
    small = resources.rule_resources("generate", _size("qwen3-1.7b"), work, "cuda")
    assert 16 * small.gpu_mem_mb <= 80_000  # and all sixteen at 1.7B on an 80 GB card
    perplexity = resources.device_held_bytes("perplexity", size, work)  # the parent engine, then each W8A8 one
    assert perplexity - size.parent_bytes == (2 * 4 + 2) * size.vocab * 2048  # two float32 copies, the bf16 logits
    for rule in ("capture", "compare", "requant", "prediction", "ksweep"):
        r = resources.rule_resources(rule, size, work, "cuda")
        assert 0 < r.gpu_mem_mb < 139_000 and r.gpu_mem_mb * 2**20 >= 1.2 * resources.device_held_bytes(rule, size, work), rule
    assert all(resources.rule_resources(r, size, work, "cpu").gpu_mem_mb == 0 for r in resources.RULE_STAGE)


def test_tokens_asks_for_its_largest_batch_of_logits_which_fits_a_24_gb_card_at_1_7b():
    """The kernel pair's three copies of a 2,048-token window are tokens' largest forward (each injection
    cell runs in a batch of two, tokens.yaml injection.batches), so its request at 1.7B stays under a
    24 GB card's budget; at 14B the parent and checkpoint alone do not."""
    size, work = _size("qwen3-1.7b"), _study()
    tokens = resources.rule_resources("tokens", size, work, "cuda")
    logits = resources.TOKENS_BATCH_COPIES * 2048 * size.vocab * resources.TOKENS_LOGIT_BYTES
    need = GIB + resources.device_held_bytes("tokens", size, work) + logits
    assert tokens.gpu_need_mb == math.ceil(need / 2**20)
    assert tokens.gpu_mem_mb * 2**20 >= 1.2 * need
    assert tokens.gpu_need_mb < 24_000
    assert resources.rule_resources("tokens", _size("qwen3-14b"), work, "cuda").gpu_need_mb > 24_000


def test_faults_asks_for_its_batch_budget_of_the_device_or_all_of_it_when_the_device_is_unknown():
    size, work = _size("qwen3-8b"), _study()
    unknown = resources.rule_resources("faults", size, work, "cuda")
    assert unknown.gpu_mem_mb == resources.WHOLE_DEVICE_MB
    known = resources.rule_resources("faults", size, work, "cuda", device_mb=130_000)
    share = 130_000 // resources.MEMORY_SHARE
    assert share < known.gpu_mem_mb < 130_000 // 2
    shard = resources.rule_resources("faults_shard", size, work, "cuda", faults_shards=4, device_mb=130_000)
    assert shard.gpu_mem_mb == known.gpu_mem_mb


def test_the_longest_chains_start_before_the_generate_jobs():
    for rule in ("tokens", "capture", "prediction", "compare", "faults", "faults_shard", "prefill_decode",
                 "perplexity"):
        assert resources.rule_priority(rule) > resources.rule_priority("generate"), rule


# ------------------------------------------------------------------ the device-memory budget

CARDS = {"rtx-4090": 23_700, "a100-80gb": 80_100, "h200": 139_000}  # device 0's free MiB when planned


def _budgeted_run(preset: str, budget: int) -> dict:
    return {"model": {"source": "synthetic", "synthetic": {"preset": preset}}, "size_profile": "study",
            "device": "cuda", "resolved": {"device": "cuda", "gpu_budget": {
                "spec": "auto", "mb": budget, "reason": "auto: faked card"}}}


@pytest.mark.parametrize("card", sorted(CARDS))
@pytest.mark.parametrize("preset", ["qwen3-1.7b", "qwen3-8b", "qwen3-14b"])
def test_every_gpu_job_fits_the_budget_or_the_plan_names_the_stages_that_cannot(card: str, preset: str):
    budget, protocol = CARDS[card], load()
    unbudgeted = resources.plan_resources(
        {**_budgeted_run(preset, budget), "resolved": {"device": "cuda"}}, protocol, device_mb=budget)
    too_big = sorted(resources.RULE_STAGE[r] for r in resources.FORWARD_RULES if unbudgeted[r].gpu_need_mb > budget)
    if too_big:
        with pytest.raises(InputError) as err:
            resources.plan_resources(_budgeted_run(preset, budget), protocol)
        message = str(err.value)
        for stage in too_big:
            assert f"stage {stage} needs about {unbudgeted[stage].gpu_need_mb} MiB" in message
        assert f"gpu_budget_mb={budget}" in message and "device: cpu" in message
        return
    plan = resources.plan_resources(_budgeted_run(preset, budget), protocol)
    for rule in resources.GPU_RULES:
        assert 0 < plan[rule].gpu_mem_mb <= budget, rule
        assert plan[rule].gpu_mem_mb == min(unbudgeted[rule].gpu_mem_mb, budget), rule  # a cap, no other change
    assert plan["faults"].gpu_mem_mb < budget  # its batches take a share of the budget, not the whole device


def test_the_cards_get_the_plans_their_memory_allows():
    """What the three cards run at study sizes, from the estimates: an H200 and an A100-80GB every size,
    a 4090 1.7B and 8B (at 14B the perplexity stage's bf16 parent alone is about 29.5 GB)."""
    protocol = load()

    def fits(preset: str, card: str) -> bool:
        try:
            resources.plan_resources(_budgeted_run(preset, CARDS[card]), protocol)
        except InputError:
            return False
        return True

    tokens = {p: resources.rule_resources("tokens", _size(p), _study(), "cuda").gpu_need_mb
              for p in ("qwen3-1.7b", "qwen3-8b", "qwen3-14b")}
    for card, budget in CARDS.items():
        for preset, need in tokens.items():
            assert fits(preset, card) == (need <= budget and all(
                resources.rule_resources(r, _size(preset), _study(), "cuda").gpu_need_mb <= budget
                for r in resources.FORWARD_RULES)), (card, preset)
    assert fits("qwen3-14b", "h200") and fits("qwen3-14b", "a100-80gb")
    assert fits("qwen3-8b", "rtx-4090") and not fits("qwen3-14b", "rtx-4090")


def test_the_refusal_says_which_size_profile_fits():
    with pytest.raises(InputError, match=r"stage tokens needs about \d+ MiB.*size_profile default-cpu or tiny"):
        resources.plan_resources(_budgeted_run("qwen3-1.7b", 12_000), load())
    with pytest.raises(InputError, match=r"stage perplexity needs about \d+ MiB.*MiB free \(or gpu_budget_mb raised to "
                                         r"it where the card has it\), or device: cpu"):
        resources.plan_resources(_budgeted_run("qwen3-14b", CARDS["rtx-4090"]), load())


def test_the_limit_is_the_given_one_else_a_cuda_runs_budget():
    run = _budgeted_run("qwen3-1.7b", 23_700)
    assert resources.device_limit(None, run) == 23_700
    assert resources.device_limit(40_000, run) == 40_000
    assert resources.device_limit(None, {**run, "resolved": {**run["resolved"], "device": "cpu"}}) is None
    assert resources.device_limit(None, {"device": "cuda", "resolved": {"device": "cuda"}}) is None


def test_an_unknown_parent_asks_for_the_budget_not_more():
    run = {**_budgeted_run("qwen3-1.7b", 23_700), "model": {"source": "hf", "parent": "${UNSET}"}}
    assert {r.gpu_mem_mb for r in resources.plan_resources(run, load()).values()} == {23_700}

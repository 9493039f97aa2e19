"""The identity contract: artifacts join only when they differ in the declared treatment."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from int8alibi.engines import vllm_engine as ve
from int8alibi.engines.identity import Identity, engine_log, join, rails_digest, read_identity, write_identity
from int8alibi.files.hashing import sha256_bytes
from int8alibi.errors import InputError


def identity(**changes: object) -> Identity:
    base = Identity(
        arm="exact-cutlass-order", checkpoint="pow2-nearest", run=1,
        prompt_digest="p" * 64, rails_digest="r" * 64, checkpoint_digest="c" * 64, parent_digest="m" * 64,
        tokenizer_digest="t" * 64, quant_config_digest="q" * 64,
        generation={"prompts": 1, "new_tokens": 4, "decoding": "greedy"},
        engine={"name": "int8alibi-own", "version": "0.1.0"},
        libraries={"torch": "2.13.0", "transformers": "5.24.0"},
        device={"device": "cpu", "compute_capability": "n/a"},
        kernel_evidence={"arm": "exact-cutlass-order", "implementation": "cutlass order"},
        cpu={"portable": True, "cpu_model": "CPU one", "cpu_flags_sha256": "f" * 64,
             "cpu_capability_detected": "AVX512", "cpu_capability_effective": "DEFAULT",
             "steering": {"OMP_NUM_THREADS": "unset"}},
        process={},
    )
    return dataclasses.replace(base, **changes)


def _cpu(**changes: object) -> dict:
    return {**identity().cpu, **changes}


def test_host_facts_may_differ_under_the_portable_settings() -> None:
    other_host = _cpu(cpu_model="CPU two", cpu_flags_sha256="e" * 64, cpu_capability_detected="AVX2",
                      steering={"OMP_NUM_THREADS": "1"})
    assert join(identity(), identity(cpu=other_host, **ARM_B), "arm") == []


def test_host_facts_must_agree_without_the_portable_settings() -> None:
    a = identity(cpu=_cpu(portable=False, cpu_capability_effective="AVX512"))
    b = identity(cpu=_cpu(portable=False, cpu_capability_effective="AVX512", cpu_model="CPU two"), **ARM_B)
    with pytest.raises(InputError, match="cpu.cpu_model"):
        join(a, b, "arm")


def test_the_effective_capability_must_agree_even_when_portable() -> None:
    with pytest.raises(InputError, match="cpu.cpu_capability_effective"):
        join(identity(), identity(cpu=_cpu(cpu_capability_effective="AVX2"), **ARM_B), "arm")


ARM_B = {"arm": "exact-triton-order", "kernel_evidence": {"arm": "exact-triton-order", "implementation": "triton order"}}


def test_artifacts_differing_only_in_the_arm_join() -> None:
    assert join(identity(), identity(**ARM_B), "arm") == []


def test_a_tampered_tokenizer_digest_is_named_with_both_values() -> None:
    with pytest.raises(InputError) as err:
        join(identity(), identity(tokenizer_digest="x" * 64, **ARM_B), "arm")
    message = str(err.value)
    assert "tokenizer_digest" in message and "t" * 64 in message and "x" * 64 in message


def test_a_nested_field_is_named_by_its_dotted_path() -> None:
    with pytest.raises(InputError, match=r"libraries\.torch: '2\.13\.0' vs '2\.11\.0'"):
        join(identity(), identity(libraries={"torch": "2.11.0", "transformers": "5.24.0"}, **ARM_B), "arm")
    with pytest.raises(InputError, match=r"generation\.seed: '<absent>' vs 0"):
        join(identity(), identity(generation={"prompts": 1, "new_tokens": 4, "decoding": "greedy", "seed": 0},
                                  **ARM_B), "arm")


def test_runs_of_one_arm_must_agree_on_the_kernel_evidence() -> None:
    assert join(identity(), identity(run=2), "run") == []
    with pytest.raises(InputError, match=r"kernel_evidence\.implementation"):
        join(identity(), identity(run=2, kernel_evidence={"arm": "exact-cutlass-order", "implementation": "x"}), "run")
    with pytest.raises(InputError, match=r"arm: 'exact-cutlass-order' vs 'exact-triton-order'"):
        join(identity(), identity(run=2, **ARM_B), "run")


def test_the_treatment_must_actually_differ() -> None:
    with pytest.raises(InputError, match="declared treatment 'arm' does not differ"):
        join(identity(), identity(), "arm")
    with pytest.raises(InputError, match="unknown treatment"):
        join(identity(), identity(), "checkpoint")  # type: ignore[arg-type]


def test_allow_unverified_returns_every_violation_instead_of_raising() -> None:
    found = join(identity(), identity(tokenizer_digest="x" * 64, device={"device": "cuda"}, **ARM_B), "arm",
                 allow_unverified=True)
    assert [m.field for m in found] == ["device.compute_capability", "device.device", "tokenizer_digest"]


def test_identity_files_round_trip_and_are_validated(tmp_path: Path) -> None:
    path = write_identity(tmp_path / "run1.identity.json", identity())
    back = read_identity(path)
    assert back == identity() and back.source == str(path)
    data = json.loads(path.read_text())
    del data["tokenizer_digest"]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="'tokenizer_digest' is missing"):
        read_identity(path)
    data["tokenizer_digest"] = 7
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="'tokenizer_digest' must be str"):
        read_identity(path)
    data["tokenizer_digest"], data["run"] = "t" * 64, True
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="'run' must be int"):
        read_identity(path)
    with pytest.raises(InputError, match="not found"):
        read_identity(tmp_path / "absent.json")


def vllm_identity(arm: str, run: int = 1, **changes: object) -> Identity:
    """A vLLM artifact as the generate stage writes it (evidence from verify_selection)."""
    kernel = ve.ARM_KERNELS[arm][0]
    log = f"INFO 12-02 00:10:07 [__init__.py:668] Selected {kernel} for {ve.INT8_SCHEME}\n"
    base = identity(arm=arm, run=run, engine={"name": "vllm", "version": "0.26.0"},
                    kernel_evidence=ve.verify_selection(arm, ve.parse_selection(log), "x.log"),
                    process={"log": "run1.vllm/x.vllm.log", "log_sha256": f"{run:x}" * 64})
    return dataclasses.replace(base, **changes)


def test_vllm_artifacts_join_across_arms_and_runs_whatever_their_logs_digests() -> None:
    assert join(vllm_identity("vllm-cutlass"), vllm_identity("vllm-triton"), "arm") == []
    assert join(vllm_identity("vllm-triton", 1), vllm_identity("vllm-triton", 2), "run") == []


@pytest.mark.parametrize(("evidence", "process", "problem"), [
    ({}, None, "empty kernel evidence"),
    ({"arm": "vllm-triton"}, None, "names arm 'vllm-triton'"),
    ({"selected": []}, None, "not a non-empty list"),
    ({"selected": ["garbage"]}, None, "not a non-empty list"),
    ({"selected": ["TritonInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8"]}, None, "alone"),
    ({"requested_kernel": "TritonInt8ScaledMMLinearKernel"}, None, "requested_kernel"),
    ({"environment": {ve.DISABLE_VAR: "CutlassInt8ScaledMMLinearKernel"}}, None, "environment"),
    (None, {"log_sha256": ""}, "not a SHA-256"),
    (None, {}, "not a SHA-256"),
])
def test_the_join_refuses_empty_or_malformed_kernel_evidence(evidence: dict | None, process: dict | None,
                                                             problem: str) -> None:
    good = vllm_identity("vllm-cutlass")
    bad_evidence = {} if evidence == {} else {**good.kernel_evidence, **(evidence or {})}
    bad = dataclasses.replace(good, kernel_evidence=bad_evidence, process=good.process if process is None else process)
    with pytest.raises(InputError, match="kernel evidence does not verify") as caught:
        join(bad, vllm_identity("vllm-triton"), "arm")
    assert problem in str(caught.value)
    found = join(bad, vllm_identity("vllm-triton"), "arm", allow_unverified=True)
    assert found[0].field == "kernel_evidence of a" and problem in found[0].b


def test_own_engine_evidence_must_name_the_artifacts_arm() -> None:
    with pytest.raises(InputError, match="kernel evidence does not verify"):
        join(identity(kernel_evidence={}), identity(**ARM_B), "arm")


def test_the_rails_digest_follows_every_decoding_setting() -> None:
    generation = {"prompts": 8, "new_tokens": 64, "decoding": "greedy"}
    engine = {"decoding": "greedy, one prompt per call", "settings": {"enforce_eager": True}}
    base = rails_digest(generation, engine)
    assert base == rails_digest(dict(generation), dict(engine))
    assert base != rails_digest({**generation, "new_tokens": 63}, engine)
    assert base != rails_digest(generation, {**engine, "settings": {"enforce_eager": False}})


def test_the_engine_log_is_re_hashed_against_its_recorded_digest(tmp_path: Path) -> None:
    assert engine_log(identity(), tmp_path) is None  # the own engine keeps no log
    (tmp_path / "run1.vllm").mkdir()
    log = tmp_path / "run1.vllm" / "vllm-cutlass.vllm.log"
    ident = vllm_identity("vllm-cutlass", process={"log": "run1.vllm/vllm-cutlass.vllm.log",
                                                   "log_sha256": sha256_bytes(b"Selected it\n")})
    with pytest.raises(InputError, match="engine log .* is missing"):
        engine_log(ident, tmp_path)
    log.write_bytes(b"Selected it\n")
    assert engine_log(ident, tmp_path) == log
    log.write_bytes(b"Selected another\n")
    with pytest.raises(InputError, match="SHA-256 differs from the one recorded"):
        engine_log(ident, tmp_path)

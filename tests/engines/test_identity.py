"""The identity contract: artifacts join only when they differ in the declared treatment."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from int8alibi.engines.identity import Identity, join, read_identity, write_identity
from int8alibi.errors import InputError


def identity(**changes: object) -> Identity:
    base = Identity(
        arm="exact-cutlass-order", checkpoint="pow2-nearest", run=1,
        prompt_digest="p" * 64, checkpoint_digest="c" * 64, parent_digest="m" * 64,
        tokenizer_digest="t" * 64, quant_config_digest="q" * 64,
        generation={"prompts": 1, "new_tokens": 4, "decoding": "greedy"},
        engine={"name": "int8alibi-own", "version": "0.1.0"},
        libraries={"torch": "2.13.0", "transformers": "5.24.0"},
        device={"device": "cpu", "compute_capability": "n/a"},
        kernel_evidence={"arm": "exact-cutlass-order", "implementation": "cutlass order"},
        cpu={"portable": True, "cpu_model": "CPU one", "cpu_flags_sha256": "f" * 64,
             "cpu_capability_detected": "AVX512", "cpu_capability_effective": "DEFAULT",
             "steering": {"OMP_NUM_THREADS": "unset"}},
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

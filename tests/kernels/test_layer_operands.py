"""Operands: validation, safetensors round trip with digests, tamper detection, Qwen3 shapes, synthetic layers."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from int8alibi.errors import InputError
from int8alibi.kernels.layer_operands import (
    QWEN3_SHAPES,
    ModelShapes,
    Operands,
    load_operands,
    operand_digest,
    save_operands,
    synthetic_layers,
)

SMALL = ModelShapes(2, (("self_attn", "q_proj", 64, 32), ("mlp", "down_proj", 96, 64)))


def small_ops(m: int = 5, seed: int = 0) -> list[Operands]:
    return list(synthetic_layers(SMALL, m=m, seed=seed))


def test_operands_validate_and_expose_sizes():
    op = small_ops()[1]
    assert (op.m, op.k, op.n) == (5, 96, 64) and op.proj == "down_proj" and op.block == 0
    with pytest.raises(InputError, match="layer 'x'"):
        Operands("x", 0, "q_proj", op.a_q, op.s_a[:2], op.w_q, op.s_w)
    with pytest.raises(InputError, match="int8"):
        Operands("x", 0, "q_proj", op.a_q.float(), op.s_a, op.w_q, op.s_w)


def test_digest_covers_bytes_shape_and_dtype():
    op = small_ops()[0]
    same = Operands("other-name", 3, "q_proj", op.a_q.clone(), op.s_a.clone(), op.w_q.clone(), op.s_w.clone())
    assert operand_digest(op) == operand_digest(same)  # the digest is about the tensors only
    a_q = op.a_q.clone()
    a_q[0, 0] ^= 1
    assert operand_digest(Operands(op.layer, 0, "q_proj", a_q, op.s_a, op.w_q, op.s_w)) != operand_digest(op)
    s_a = op.s_a.clone()
    s_a[0] = torch.nextafter(s_a[0], torch.tensor(1.0))
    assert operand_digest(Operands(op.layer, 0, "q_proj", op.a_q, s_a, op.w_q, op.s_w)) != operand_digest(op)


def test_save_load_round_trip(tmp_path):
    ops = small_ops()
    path = save_operands(tmp_path / "sub" / "ops.safetensors", ops)
    loaded = load_operands(path)
    assert [o.layer for o in loaded] == [o.layer for o in ops]
    for a, b in zip(ops, loaded):
        assert (a.block, a.proj) == (b.block, b.proj) and operand_digest(a) == operand_digest(b)
        for name in ("a_q", "s_a", "w_q", "s_w"):
            assert torch.equal(getattr(a, name), getattr(b, name))
    assert not list(path.parent.glob(".*tmp"))


def test_tampered_file_is_refused(tmp_path):
    path = save_operands(tmp_path / "ops.safetensors", small_ops())
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(header_len))["__metadata__"]
    tensors = load_file(str(path))
    tensors["model.layers.1.mlp.down_proj:w_q"][0, 0] += 1
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(InputError, match=r"ops.safetensors: layer 'model.layers.1.mlp.down_proj'.*digest"):
        load_operands(path)


def test_missing_or_extra_tensors_and_foreign_files_are_refused(tmp_path):
    path = save_operands(tmp_path / "ops.safetensors", small_ops())
    tensors = load_file(str(path))
    with open(path, "rb") as f:
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]
    del tensors["model.layers.0.self_attn.q_proj:s_a"]
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(InputError, match="do not match the index"):
        load_operands(path)
    save_file({"x": torch.zeros(2)}, str(path))
    with pytest.raises(InputError, match="operand index missing"):
        load_operands(path)
    (tmp_path / "junk").write_bytes(b"not safetensors")
    with pytest.raises(InputError, match="junk: not a readable safetensors"):
        load_operands(tmp_path / "junk")


def test_duplicate_layers_are_refused(tmp_path):
    op = small_ops()[0]
    with pytest.raises(InputError, match="duplicate"):
        save_operands(tmp_path / "ops.safetensors", [op, op])


def test_qwen3_shapes():
    layers = QWEN3_SHAPES["qwen3-1.7b"].layers()
    assert len(layers) == 196
    assert {(k, n) for _, _, _, k, n in layers} == {(2048, 2048), (2048, 1024), (2048, 6144), (6144, 2048)}
    assert layers[0][0] == "model.layers.0.self_attn.q_proj" and layers[-1][0] == "model.layers.27.mlp.down_proj"
    for shapes in QWEN3_SHAPES.values():
        assert all(k % 16 == 0 and n % 16 == 0 for *_, k, n in shapes.layers())


def test_synthetic_layers_are_seeded_and_independent_of_selection():
    first = small_ops(seed=3)
    again = small_ops(seed=3)
    other = small_ops(seed=4)
    assert [operand_digest(o) for o in first] == [operand_digest(o) for o in again]
    assert all(operand_digest(a) != operand_digest(b) for a, b in zip(first, other))
    one_block = list(synthetic_layers(SMALL, m=5, seed=3, blocks=1))
    assert [operand_digest(o) for o in one_block] == [operand_digest(o) for o in first[:2]]
    decode = list(synthetic_layers(SMALL, m=1, seed=3, blocks=1))
    assert all(torch.equal(d.w_q, p.w_q) and torch.equal(d.s_w, p.s_w) for d, p in zip(decode, one_block))


def test_synthetic_scales_follow_the_quantization_rules():
    op = list(synthetic_layers(QWEN3_SHAPES["qwen3-1.7b"], m=16, seed=0, blocks=1))[0]
    # Per-token activations: every non-empty row reaches +-127, scale = absmax/127 > 0.
    assert bool((op.a_q.to(torch.int32).abs().amax(dim=1) == 127).all()) and bool((op.s_a > 0).all())
    # Per-channel weights: bf16-valued scales of absmax/127.5 for N(0, 0.02) weights; -128 occurs.
    assert torch.equal(op.s_w.to(torch.bfloat16).to(torch.float32), op.s_w)
    assert 1e-4 < float(op.s_w.min()) and float(op.s_w.max()) < 2e-3
    assert int(op.w_q.min()) == -128 and int(op.w_q.max()) == 127
    # Outlier channels make many tokens' scales much larger than their typical element.
    typical = (op.a_q.to(torch.float32).abs().mean(dim=1))
    assert float(typical.median()) < 20


@pytest.mark.parametrize("kwargs,match", [({"shapes": "qwen9"}, "unknown shapes"), ({"m": 0}, "m=0"),
                                          ({"blocks": 0}, "blocks=0"), ({"blocks": 29}, "blocks=29")])
def test_synthetic_layers_refuse_bad_arguments(kwargs, match):
    with pytest.raises(InputError, match=match):
        next(synthetic_layers(**kwargs))


def test_saving_the_same_operands_twice_gives_identical_bytes(tmp_path):
    """Capture determinism is checked on file bytes too, not only on tensor digests."""
    a = save_operands(tmp_path / "a.safetensors", small_ops())
    b = save_operands(tmp_path / "b.safetensors", small_ops())
    assert a.read_bytes() == b.read_bytes()

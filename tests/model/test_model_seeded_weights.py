"""Counter-hash weights: splitmix64's published stream, integer sums in range, exact float32 values at
the boundary sums, row gains, and the same bits whatever the chunking or thread count."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.model import seeded_weights as sw

MASK = (1 << 64) - 1


def _splitmix64_reference(key: int, index: int) -> int:
    """splitmix64 in Python integers, written from its definition (not from the module)."""
    z = (key + (index + 1) * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def test_splitmix64_gives_the_published_stream_of_seed_zero():
    # splitmix64 seeded with 0: its first outputs as published with the reference C code.
    assert [int(v) for v in sw.splitmix64(0, 0, 3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


@pytest.mark.parametrize("key", [0, 1, 0x9E3779B97F4A7C15, MASK, sw.tensor_key(5, "model.norm.weight")])
def test_hash_and_sums_match_the_integer_definition(key):
    starts = [0, 1, 2**31 - 3, 2**40 + 7]
    for start in starts:
        z = sw.splitmix64(key, start, 5)
        expected = [_splitmix64_reference(key, start + j) for j in range(5)]
        assert [int(v) for v in z] == expected
        sums = sw.field_sums(key, start, 5)
        assert [int(s) for s in sums] == [sum((e >> shift) & 0xFFFF for shift in (0, 16, 32, 48)) for e in expected]
        assert all(0 <= int(s) <= sw.SUM_MAX for s in sums)


BOUNDARY_SUMS = np.array([0, 1, sw.SUM_CENTRE - 1, sw.SUM_CENTRE, sw.SUM_CENTRE + 1, sw.SUM_MAX - 1, sw.SUM_MAX])


def test_element_values_at_the_boundary_sums_are_exact_float32_products():
    scale = np.float32(0.02 / sw.SUM_SIGMA)
    values = sw.element_values(BOUNDARY_SUMS, np.full(BOUNDARY_SUMS.size, scale))
    # torch's float32 multiply of the exactly representable centred integers, independently
    expected = torch.tensor([float(s - sw.SUM_CENTRE) for s in BOUNDARY_SUMS], dtype=torch.float32) * float(scale)
    assert torch.equal(torch.from_numpy(values), expected)
    assert values[3] == 0.0 and np.array_equal(values[::-1], -values)  # zero at the centre, symmetric
    assert values[-1] == pytest.approx(3.4641 * 0.02, rel=1e-4)  # the sum's bound: sqrt(3) sigma each side
    shifted = sw.element_values(BOUNDARY_SUMS, np.full(BOUNDARY_SUMS.size, scale), 1.0)
    assert torch.equal(torch.from_numpy(shifted), expected + torch.tensor(1.0, dtype=torch.float32))
    assert shifted[3] == 1.0


def test_row_gains_and_scales_at_their_boundaries():
    assert list(sw.row_gains(np.array([0, sw.SUM_CENTRE, sw.SUM_MAX]))) == [0.25, 1.0, 1.75]
    key = sw.tensor_key(0, "w|rows")
    scales = sw.row_scales(key, 3 * sw.CHUNK + 5, 0.02)  # more rows than one chunk of sums
    sums = [int(sw.field_sums(key, r, 1)[0]) for r in (0, sw.CHUNK, 3 * sw.CHUNK + 4)]
    expected = [np.float32(0.02 * (1 + 0.75 * (s - 131070) / 131070) / (sw.SUM_SIGMA * sw.GAIN_RMS)) for s in sums]
    assert [scales[0], scales[sw.CHUNK], scales[-1]] == expected
    flat = sw.row_scales(key, 4, 0.02, gains=False)
    assert flat.dtype == np.float32 and set(flat.tolist()) == {float(np.float32(0.02 / sw.SUM_SIGMA))}
    with pytest.raises(InputError, match="std=0"):
        sw.row_scales(key, 4, 0.0)


def test_a_matrix_has_the_stated_std_and_spread_row_scales():
    w = sw.seeded_tensor((512, 4096), 1, "model.layers.0.mlp.up_proj.weight", 0.02).float()
    assert abs(w.std().item() - 0.02) < 2e-4 and abs(w.mean().item()) < 1e-4
    absmax = w.abs().amax(dim=1)
    assert (absmax.max() / absmax.min()).item() > 3  # rows' int8 scales cover more than an octave and a half
    signed = w.gather(1, w.abs().argmax(dim=1, keepdim=True))
    assert 0.4 < (signed < 0).float().mean().item() < 0.6  # rows whose absmax is negative, as in a real model


def test_std_of_the_sum_is_that_of_four_uniform_fields():
    values = torch.arange(0x10000, dtype=torch.float64)
    assert sw.SUM_SIGMA == pytest.approx(4 ** 0.5 * values.std(unbiased=False).item(), rel=1e-12)


@pytest.mark.parametrize("chunk", [sw.CHUNK, 1000, 1, 4097])
def test_fill_is_the_same_for_every_chunking(chunk):
    shape = (37, 113) if chunk == 1 else (301, 257)  # chunk 1 is slow: a smaller tensor
    key, scales = sw.tensor_key(3, "w"), sw.row_scales(sw.tensor_key(3, "w|rows"), shape[0], 0.02)
    reference = sw.fill(torch.empty(shape, dtype=torch.bfloat16), key, scales)
    other = sw.fill(torch.empty(shape, dtype=torch.bfloat16), key, scales, chunk=chunk)
    assert torch.equal(reference.view(torch.int16), other.view(torch.int16))
    # element (r, c) is bf16(float32(s - centre) * scale[r]) for the sum of its flat index
    for r, c in ((0, 0), (0, 1), (shape[0] // 2, shape[1] - 1), (shape[0] - 1, shape[1] - 1)):
        s = int(sw.field_sums(key, r * shape[1] + c, 1)[0])
        expected = (torch.tensor(float(s - sw.SUM_CENTRE), dtype=torch.float32) * float(scales[r])).to(torch.bfloat16)
        assert reference[r, c].view(torch.int16) == expected.view(torch.int16)


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_worker_processes_make_the_same_bytes_as_one_process(offset):
    shape = (1031, sw.PROCESS_MIN // 1031 + 7)  # above PROCESS_MIN, spans not aligned to rows
    one = sw.seeded_tensor(shape, 5, "big", 0.02, offset, threads=1)
    for workers, chunk in ((3, sw.CHUNK), (2, 4097)):
        shared = sw.seeded_tensor(shape, 5, "big", 0.02, offset, threads=workers, chunk=chunk)
        assert shared.shape == shape and shared.dtype == torch.bfloat16 and shared.is_contiguous()
        assert torch.equal(shared.view(torch.int16), one.view(torch.int16))
    assert not torch.equal(one.view(torch.int16), sw.seeded_tensor(shape, 5, "big", 0.02, 1 - offset).view(torch.int16))


def test_without_room_for_a_shared_file_the_tensor_is_filled_in_this_process(monkeypatch, caplog):
    shape = (1031, sw.PROCESS_MIN // 1031 + 7)
    one = sw.seeded_tensor(shape, 5, "big", 0.02, threads=1)

    def full(self, size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sw._Shared, "__init__", full)
    fallback = sw.seeded_tensor(shape, 5, "big", 0.02, threads=2)
    assert torch.equal(fallback.view(torch.int16), one.view(torch.int16))
    assert "no shared file for the workers" in caplog.text and "No space left on device" in caplog.text


def test_bf16_bits_round_to_nearest_even_as_torch_does_at_the_boundaries():
    bits = np.array([0, 0x80000000, 1, 0x007FFFFF, 0x00800000,  # zeros, subnormals, the smallest normal
                     0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,  # ties to even (down, up), either side
                     0xBF808000, 0xBF818000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000],  # max: to inf
                    dtype=np.uint32)
    rng = np.random.default_rng(0)
    spread = rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)
    spread = spread[np.isfinite(spread.view(np.float32))]
    for case in (bits, spread):
        values = case.view(np.float32)
        expected = torch.from_numpy(values.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        assert np.array_equal(sw.bf16_bits(values), expected)


def test_a_prefix_is_the_start_of_a_longer_tensor_and_keys_differ_by_name_and_seed():
    a = sw.seeded_tensor((1000,), 0, "x", 0.02)
    b = sw.seeded_tensor((5000,), 0, "x", 0.02)
    assert torch.equal(a.view(torch.int16), b[:1000].view(torch.int16))
    assert len({sw.tensor_key(s, n) for s in (0, 1) for n in ("x", "y")}) == 4
    assert not torch.equal(a, sw.seeded_tensor((1000,), 1, "x", 0.02))


def test_bad_arguments_are_refused():
    scales = sw.row_scales(1, 2, 0.02)
    with pytest.raises(InputError, match="seed=-1"):
        sw.tensor_key(-1, "x")
    with pytest.raises(InputError, match="bf16 CPU"):
        sw.fill(torch.empty(4), 1, scales)
    with pytest.raises(InputError, match="chunk=0"):
        sw.fill(torch.empty(4, dtype=torch.bfloat16), 1, scales, chunk=0)
    with pytest.raises(InputError, match="3 float32 row scales do not divide 4"):
        sw.fill(torch.empty(4, dtype=torch.bfloat16), 1, sw.row_scales(1, 3, 0.02))

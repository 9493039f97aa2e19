"""Counter-hash weights: splitmix64's published stream, integer sums in range, an exact value table,
and the same bits whatever the chunking or thread count."""

from __future__ import annotations

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


def test_value_table_boundaries_are_exact():
    table = sw.value_table(0.02)
    assert table.dtype == torch.bfloat16 and table.numel() == sw.SUM_MAX + 1 == 262141
    step = torch.tensor(0.02 / sw.SUM_SIGMA, dtype=torch.float32)
    for s in (0, 1, sw.SUM_CENTRE - 1, sw.SUM_CENTRE, sw.SUM_CENTRE + 1, sw.SUM_MAX - 1, sw.SUM_MAX):
        expected = (torch.tensor(float(s - sw.SUM_CENTRE), dtype=torch.float32) * step).to(torch.bfloat16)
        assert table[s].view(torch.int16) == expected.view(torch.int16), s
    assert table[sw.SUM_CENTRE].item() == 0.0
    assert torch.equal(table.flip(0).float(), -table.float())  # symmetric about the centre
    assert bool((table[1:].float() >= table[:-1].float()).all())  # monotone
    assert table[-1].item() == pytest.approx(3.4641 * 0.02, rel=5e-3)  # the sum's bound: sqrt(12)/2 * 2 sigma
    norms = sw.value_table(0.02, 1.0)
    assert norms[sw.SUM_CENTRE].item() == 1.0 and norms[0].item() < 1.0 < norms[-1].item()
    with pytest.raises(InputError, match="std=0"):
        sw.value_table(0.0)


def test_std_of_the_sum_is_that_of_four_uniform_fields():
    values = torch.arange(0x10000, dtype=torch.float64)
    assert sw.SUM_SIGMA == pytest.approx(4 ** 0.5 * values.std(unbiased=False).item(), rel=1e-12)


@pytest.mark.parametrize("threads,chunk", [(1, sw.CHUNK), (3, 1000), (2, 1), (8, 4097)])
def test_fill_is_the_same_for_every_chunking_and_thread_count(threads, chunk):
    shape = (37, 113) if chunk == 1 else (301, 257)  # chunk 1 is slow: a smaller tensor
    key, table = sw.tensor_key(3, "w"), sw.value_table(0.02)
    reference = sw.fill(torch.empty(shape, dtype=torch.bfloat16), key, table, threads=1)
    other = sw.fill(torch.empty(shape, dtype=torch.bfloat16), key, table, threads=threads, chunk=chunk)
    assert torch.equal(reference.view(torch.int16), other.view(torch.int16))
    # element i is table[sum(i)]: the flat index, independent of the shape it is laid out in
    flat = reference.reshape(-1)
    for i in (0, 1, flat.numel() // 2, flat.numel() - 1):
        assert flat[i].view(torch.int16) == table[int(sw.field_sums(key, i, 1)[0])].view(torch.int16)


def test_a_prefix_is_the_start_of_a_longer_tensor_and_keys_differ_by_name_and_seed():
    a = sw.seeded_tensor((1000,), 0, "x", 0.02)
    b = sw.seeded_tensor((5000,), 0, "x", 0.02)
    assert torch.equal(a.view(torch.int16), b[:1000].view(torch.int16))
    assert len({sw.tensor_key(s, n) for s in (0, 1) for n in ("x", "y")}) == 4
    assert not torch.equal(a, sw.seeded_tensor((1000,), 1, "x", 0.02))


def test_bad_arguments_are_refused():
    with pytest.raises(InputError, match="seed=-1"):
        sw.tensor_key(-1, "x")
    with pytest.raises(InputError, match="bf16 CPU"):
        sw.fill(torch.empty(4), 1, sw.value_table(0.02))
    with pytest.raises(InputError, match="chunk=0"):
        sw.fill(torch.empty(4, dtype=torch.bfloat16), 1, sw.value_table(0.02), chunk=0)

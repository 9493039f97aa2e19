"""Deterministic Parquet: same data -> same bytes (across processes and input orders), atomic
writes, schema enforcement, and a content digest that ignores file encoding."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from int8alibi.errors import InputError
from int8alibi.files import parquet
from int8alibi.files.parquet import content_digest, read_arrow, read_table, schema_digest, write_table

SCHEMA = pa.schema([
    ("layer", pa.string()),
    ("check", pa.int8()),
    ("acc", pa.int32()),
    ("value", pa.float32()),
    ("fired", pa.bool_()),
    ("note", pa.string()),
    ("count", pa.int64()),
])
KEY = ["layer", "check"]


def boundary_frame() -> pd.DataFrame:
    """Extremes of every type: int8/int32 limits, signed zeros, NaN, infinities, the smallest
    float32 subnormal, empty and non-ASCII strings, nulls."""
    return pd.DataFrame({
        "layer": ["blocks.0.q", "blocks.0.q", "blocks.1.down", "", "ü-layer", "blocks.0.q"],
        "check": np.array([-128, 127, 0, 1, 7, 3], dtype=np.int8),
        "acc": np.array([-(2**31), 2**31 - 1, 0, -1, 16256, 2**24], dtype=np.int32),
        "value": np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, np.float32(1.4e-45)], dtype=np.float32),
        "fired": [True, False, True, False, True, False],
        "note": ["", None, "fire", "silent", "n/a", "–"],
        "count": pd.array([None, 0, 2**62, -(2**63), 1, 2], dtype="Int64"),
    })


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_round_trip_keeps_every_value_bit_for_bit(tmp_path: Path) -> None:
    df = boundary_frame()
    path = write_table(df, tmp_path / "t.parquet", SCHEMA, KEY)
    back = read_table(path, SCHEMA)
    expected = df.sort_values(KEY, kind="mergesort").reset_index(drop=True)
    assert list(back.columns) == SCHEMA.names
    assert back["layer"].tolist() == expected["layer"].tolist()
    assert back["check"].tolist() == expected["check"].tolist()
    assert back["acc"].tolist() == expected["acc"].tolist()
    # float bits, so -0.0 vs 0.0 and NaN are compared exactly
    assert back["value"].to_numpy(np.float32).view(np.uint32).tolist() == \
        expected["value"].to_numpy(np.float32).view(np.uint32).tolist()
    assert back["note"].isna().tolist() == expected["note"].isna().tolist()
    assert back["count"].isna().tolist() == expected["count"].isna().tolist()
    assert back["count"].dropna().astype("int64").tolist() == expected["count"].dropna().astype("int64").tolist()


def test_file_layout_is_fixed(tmp_path: Path) -> None:
    path = write_table(boundary_frame(), tmp_path / "t.parquet", SCHEMA, KEY)
    meta = pq.ParquetFile(path).metadata
    assert meta.created_by.startswith("parquet-cpp-arrow version")
    assert set(meta.metadata) == {b"ARROW:schema"}  # no pandas blob
    chunks = [meta.row_group(g).column(c) for g in range(meta.num_row_groups) for c in range(meta.num_columns)]
    assert {c.compression for c in chunks} == {"ZSTD"}
    sorting = meta.row_group(0).sorting_columns
    assert [s.column_index for s in sorting] == [SCHEMA.get_field_index(k) for k in KEY]
    assert pq.read_schema(path).remove_metadata().equals(SCHEMA)


def test_row_group_size_is_fixed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parquet, "ROW_GROUP_SIZE", 4)
    path = write_table(boundary_frame(), tmp_path / "t.parquet", SCHEMA, KEY)
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [4, 2]


def test_input_row_order_column_order_and_index_do_not_change_bytes(tmp_path: Path) -> None:
    df = boundary_frame()
    reference = sha(write_table(df, tmp_path / "ref.parquet", SCHEMA, KEY))
    rng = np.random.default_rng(0)
    for i in range(5):
        perm = rng.permutation(len(df))
        shuffled = df.iloc[perm][list(rng.permutation(df.columns))]
        shuffled.index = pd.Index(rng.integers(0, 1000, len(df)))
        assert sha(write_table(shuffled, tmp_path / f"p{i}.parquet", SCHEMA, KEY)) == reference


_WRITER = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[3])
from test_parquet import SCHEMA, KEY, boundary_frame
from int8alibi.files.parquet import write_table
df = boundary_frame()
perm = np.random.default_rng(int(sys.argv[2])).permutation(len(df))
write_table(df.iloc[perm], sys.argv[1], SCHEMA, KEY)
"""


def test_same_bytes_from_two_separate_processes(tmp_path: Path) -> None:
    paths = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(seed), str(Path(__file__).parent)],
                              env={"PYTHONHASHSEED": str(seed)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for seed, path in enumerate(paths)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    assert sha(paths[0]) == sha(paths[1])


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda df: df.drop(columns=["fired"]), "'fired' is in the schema but not in the frame"),
    (lambda df: df.assign(extra=1), "'extra' is in the frame but not in the schema"),
    (lambda df: df.assign(check=np.array([300, 0, 0, 0, 0, 0])), "'check' does not convert to int8"),
    (lambda df: df.assign(acc=["x"] * 6), "'acc' does not convert to int32"),
    (lambda df: df.assign(acc=np.full(6, 2**31, dtype=np.int64)), "'acc' does not convert to int32"),
])
def test_schema_mismatch_names_the_column(tmp_path: Path, mutate, message: str) -> None:
    target = tmp_path / "t.parquet"
    with pytest.raises(InputError, match=message) as err:
        write_table(mutate(boundary_frame()), target, SCHEMA, KEY)
    assert str(target) in str(err.value)
    assert not target.exists()


def test_non_nullable_column_rejects_null(tmp_path: Path) -> None:
    schema = pa.schema([pa.field("k", pa.int32(), nullable=False), ("v", pa.string())])
    df = pd.DataFrame({"k": pd.array([1, None], dtype="Int32"), "v": ["a", "b"]})
    with pytest.raises(InputError, match="'k' is declared non-nullable but has 1 null"):
        write_table(df, tmp_path / "t.parquet", schema, ["v"])


@pytest.mark.parametrize(("key", "message"), [
    (["layer"], "is not unique"),  # 'blocks.0.q' appears three times
    (["nope"], "sort key column 'nope' is not in the schema"),
    ([], "sort_by is empty"),
])
def test_key_must_exist_and_be_unique(tmp_path: Path, key: list[str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        write_table(boundary_frame(), tmp_path / "t.parquet", SCHEMA, key)


def test_signed_zero_keys_are_duplicates(tmp_path: Path) -> None:
    """-0.0 and 0.0 compare equal, so as keys their order would follow the input: refused."""
    schema = pa.schema([("x", pa.float64()), ("v", pa.int8())])
    df = pd.DataFrame({"x": [0.0, -0.0], "v": np.array([1, 2], dtype=np.int8)})
    with pytest.raises(InputError, match="not unique"):
        write_table(df, tmp_path / "t.parquet", schema, ["x"])


def _failing_writer(table: pa.Table, where: Path, **_: object) -> None:
    Path(where).write_bytes(b"PAR1 partial")
    raise OSError("disk full (simulated)")


def test_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parquet.pq, "write_table", _failing_writer)
    with pytest.raises(OSError, match="simulated"):
        write_table(boundary_frame(), tmp_path / "t.parquet", SCHEMA, KEY)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = write_table(boundary_frame(), tmp_path / "t.parquet", SCHEMA, KEY)
    before = sha(target)
    monkeypatch.setattr(parquet.pq, "write_table", _failing_writer)
    with pytest.raises(OSError):
        write_table(boundary_frame().iloc[:2], target, SCHEMA, KEY)
    assert sha(target) == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_content_digest_ignores_encoding_but_sees_every_bit(tmp_path: Path) -> None:
    ours = write_table(boundary_frame(), tmp_path / "t.parquet", SCHEMA, KEY)
    table = read_arrow(ours)
    other = tmp_path / "other.parquet"
    pq.write_table(table, other, compression="snappy", row_group_size=2, use_dictionary=False)
    assert sha(other) != sha(ours)
    assert content_digest(read_arrow(other)) == content_digest(table)
    assert content_digest(pa.Table.from_batches(table.to_batches(max_chunksize=1))) == content_digest(table)
    dictionary = table.set_column(0, "layer", table.column("layer").dictionary_encode())
    assert content_digest(dictionary) != content_digest(table)  # type differs: schema digest differs

    def replaced(column: str, values: pa.Array) -> str:
        return content_digest(table.set_column(SCHEMA.get_field_index(column), SCHEMA.field(column), values))

    values = table.column("value").to_numpy().copy()
    assert replaced("value", pa.array(values)) == content_digest(table)  # rebuilt, unchanged
    values[np.flatnonzero(values.view(np.uint32) == 0)[0]] = -0.0  # one +0.0 becomes -0.0
    assert replaced("value", pa.array(values)) != content_digest(table)
    notes = table.column("note").to_pylist()
    notes[notes.index("")] = None  # "" becomes null
    assert replaced("note", pa.array(notes, pa.string())) != content_digest(table)


def test_schema_digest_covers_names_types_and_nullability() -> None:
    base = pa.schema([("a", pa.int8()), ("b", pa.string())])
    variants = [
        pa.schema([("a", pa.int16()), ("b", pa.string())]),
        pa.schema([("b", pa.string()), ("a", pa.int8())]),
        pa.schema([pa.field("a", pa.int8(), nullable=False), ("b", pa.string())]),
        pa.schema([("A", pa.int8()), ("b", pa.string())]),
    ]
    assert len({schema_digest(s) for s in [base, *variants]}) == 5
    assert schema_digest(base.with_metadata({"x": "y"})) == schema_digest(base)


def test_read_table_rejects_other_schema_and_bad_files(tmp_path: Path) -> None:
    path = write_table(boundary_frame(), tmp_path / "t.parquet", SCHEMA, KEY)
    with pytest.raises(InputError, match="schema differs"):
        read_table(path, SCHEMA.set(2, pa.field("acc", pa.int64())))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(InputError, match="bad.parquet: not a readable Parquet file"):
        read_table(bad)
    with pytest.raises(InputError, match="missing.parquet: not a readable Parquet file"):
        read_table(tmp_path / "missing.parquet")


def test_empty_table(tmp_path: Path) -> None:
    empty = boundary_frame().iloc[:0]
    path = write_table(empty, tmp_path / "empty.parquet", SCHEMA, KEY)
    table = read_arrow(path)
    assert table.num_rows == 0 and table.schema.remove_metadata().equals(SCHEMA)
    assert content_digest(table) == content_digest(SCHEMA.empty_table())
    assert content_digest(table) != content_digest(read_arrow(write_table(boundary_frame(), tmp_path / "t.parquet",
                                                                          SCHEMA, KEY)))

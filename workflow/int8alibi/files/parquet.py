"""Deterministic Parquet: the same table always gives the same bytes, written atomically.

Everything that could vary between runs is fixed here: column order and types (explicit
schema), row order (sorted by a unique key), index (dropped), compression and level, row-group
and page sizes, encodings, and metadata (the pandas blob is stripped). ``created_by`` is whatever
the pinned pyarrow writes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import InputError, ManifestError
from .atomic import atomic_path
from .hashing import canonical_json, sha256_bytes

COMPRESSION = "zstd"
COMPRESSION_LEVEL = 3
ROW_GROUP_SIZE = 131_072
DATA_PAGE_SIZE = 1 << 20
FORMAT_VERSION = "2.6"


def _check_columns(df: pd.DataFrame, schema: pa.Schema, path: Path) -> None:
    columns = [str(c) for c in df.columns]
    duplicated = sorted({c for c in columns if columns.count(c) > 1})
    if duplicated:
        raise InputError(f"{path}: frame has duplicated column(s) {duplicated}")
    missing = [name for name in schema.names if name not in columns]
    extra = [name for name in columns if name not in schema.names]
    if missing:
        raise InputError(f"{path}: column {missing[0]!r} is in the schema but not in the frame"
                         + (f" (also missing: {missing[1:]})" if len(missing) > 1 else ""))
    if extra:
        raise InputError(f"{path}: column {extra[0]!r} is in the frame but not in the schema"
                         + (f" (also extra: {extra[1:]})" if len(extra) > 1 else ""))


def _to_arrow(df: pd.DataFrame, schema: pa.Schema, path: Path) -> pa.Table:
    """Convert column by column so a type error names its column."""
    arrays = []
    for field in schema:
        try:
            arrays.append(pa.array(df[field.name], type=field.type, from_pandas=False))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
                ValueError, OverflowError) as exc:
            raise InputError(f"{path}: column {field.name!r} does not convert to {field.type}: {exc}") from exc
        if not field.nullable and arrays[-1].null_count:
            raise InputError(f"{path}: column {field.name!r} is declared non-nullable but has "
                             f"{arrays[-1].null_count} null(s)")
    metadata = {k: v for k, v in (schema.metadata or {}).items() if k != b"pandas"}
    return pa.Table.from_arrays(arrays, schema=schema.with_metadata(metadata or None))


def _sorted_by_key(table: pa.Table, df: pd.DataFrame, sort_by: Sequence[str], path: Path) -> pa.Table:
    if not sort_by:
        raise InputError(f"{path}: sort_by is empty; every table is sorted by a key")
    unknown = [c for c in sort_by if c not in table.schema.names]
    if unknown:
        raise InputError(f"{path}: sort key column {unknown[0]!r} is not in the schema")
    duplicated = df.duplicated(subset=list(sort_by), keep=False)
    if duplicated.any():
        first = df.loc[duplicated, list(sort_by)].iloc[0].to_dict()
        raise InputError(f"{path}: key {list(sort_by)} is not unique ({int(duplicated.sum())} rows share "
                         f"a key, e.g. {first}); row order would depend on input order")
    order = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in sort_by])  # stable; nulls last
    return table.take(order).combine_chunks()


def write_table(df: pd.DataFrame, path: str | os.PathLike[str], schema: pa.Schema,
                sort_by: Sequence[str]) -> Path:
    """Write ``df`` to ``path`` as deterministic Parquet and return the path.

    The frame must have exactly the schema's columns (any order; the index is dropped); rows
    are sorted by ``sort_by``, which must be a unique key, so input row order cannot matter.
    Values convert exactly or not at all (an int8 column rejects 300); a float NaN stays NaN,
    a null is written only for None/pd.NA. The file appears only complete: it is written to a
    temporary file and renamed.
    """
    target = Path(path)
    _check_columns(df, schema, target)
    table = _sorted_by_key(_to_arrow(df, schema, target), df, sort_by, target)
    with atomic_path(target) as tmp:
        pq.write_table(
            table, tmp,
            row_group_size=ROW_GROUP_SIZE, version=FORMAT_VERSION, use_dictionary=True,
            compression=COMPRESSION, compression_level=COMPRESSION_LEVEL, write_statistics=True,
            data_page_size=DATA_PAGE_SIZE, data_page_version="1.0", use_byte_stream_split=False,
            store_schema=True, write_page_index=False, write_page_checksum=False,
            use_content_defined_chunking=False,
            sorting_columns=[pq.SortingColumn(table.schema.get_field_index(c)) for c in sort_by],
        )
    return target


def read_arrow(path: str | os.PathLike[str]) -> pa.Table:
    """Read a Parquet file as an Arrow table; a missing or corrupt file names itself."""
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from exc


def read_table(path: str | os.PathLike[str], schema: pa.Schema | None = None) -> pd.DataFrame:
    """Read a Parquet file into pandas; with ``schema``, fail unless the file has exactly it."""
    table = read_arrow(path)
    if schema is not None and not table.schema.remove_metadata().equals(schema.remove_metadata()):
        raise InputError(f"{path}: schema differs from the expected one\n  file:     "
                         f"{_schema_text(table.schema)}\n  expected: {_schema_text(schema)}")
    return table.to_pandas()


def _schema_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}{'' if f.nullable else ' not null'}" for f in schema)


def schema_digest(schema: pa.Schema) -> str:
    """Digest of column names, types and nullability, in order (metadata excluded)."""
    return sha256_bytes(canonical_json([[f.name, str(f.type), f.nullable] for f in schema]).encode())


def _byte_width(kind: pa.DataType) -> int | None:
    """Bytes per value of a fixed-width, byte-aligned, non-nested type; None otherwise."""
    if pa.types.is_nested(kind):
        return None
    try:
        bits = kind.bit_width
    except ValueError:  # variable width
        return None
    return bits // 8 if bits % 8 == 0 else None


def _column_parts(name: str, column: pa.ChunkedArray | pa.Array) -> list[bytes]:
    """Canonical bytes of one column: validity mask, then values with null slots zeroed."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    n = len(arr)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint8)
    kind = arr.type
    if pa.types.is_null(kind):
        values = b""
    elif pa.types.is_boolean(kind):
        values = np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.uint8).tobytes()
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
            or pa.types.is_large_binary(kind) or pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        dense = arr.cast(pa.large_binary()).fill_null(b"")
        _, offsets_buf, data_buf = dense.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=np.int64)[dense.offset: dense.offset + n + 1]
        start, stop = (int(offsets[0]), int(offsets[-1])) if n else (0, 0)
        data = data_buf.slice(start, stop - start).to_pybytes() if data_buf is not None else b""
        values = (offsets - start).tobytes() + data
    elif (width := _byte_width(kind)) is not None:
        buf = arr.buffers()[1]
        raw = (np.frombuffer(buf, dtype=np.uint8)[arr.offset * width:(arr.offset + n) * width]
               if buf is not None else np.zeros(n * width, np.uint8))
        rows = raw.reshape(n, width).copy()
        rows[valid == 0] = 0
        values = rows.tobytes()
    else:
        raise ManifestError(f"column {name!r}: type {kind} has no canonical content digest")
    return [name.encode(), str(kind).encode(), n.to_bytes(8, "little"), valid.tobytes(), values]


def content_digest(table: pa.Table) -> str:
    """Digest of a table's schema and data, independent of how the file encodes them.

    Two files with different compression, row groups or page layout but the same columns, types
    and values (bit for bit, in the same row order) have the same content digest.
    """
    parts = [schema_digest(table.schema).encode()]
    for name in table.schema.names:
        parts.extend(_column_parts(name, table.column(name)))
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()

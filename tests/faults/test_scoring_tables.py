"""Every table scoring derives from a campaign is written under its schema and its sort key, and
each key is unique (the writer refuses duplicates, so a key missing a column shows here)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from int8alibi.provenance.parquet import read_table
from int8alibi.scoring import MATRICES, cells_table, score
from int8alibi.stages.faults import TABLES, write_tables


def test_every_scoring_table_is_written_under_its_unique_key(campaign_rows: pd.DataFrame, protocol,
                                                            tmp_path: Path) -> None:
    cells = cells_table(score(campaign_rows, {m: protocol.matrix(m) for m in MATRICES}, False))
    written = write_tables(tmp_path, cells, protocol)
    assert set(written) == set(TABLES)
    for name, (_file, schema, key) in TABLES.items():
        table = read_table(written[name], schema)
        assert len(table) and not table.duplicated(key).any(), name
        assert table[key].equals(table[key].sort_values(key).reset_index(drop=True)), name

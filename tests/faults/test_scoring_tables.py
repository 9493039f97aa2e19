"""Every table scoring derives from a campaign is written under its schema and its sort key, and
each key is unique (the writer refuses duplicates, so a key missing a column shows here); the cells
table's score columns and the scorecard are one scoring, so they agree."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from int8alibi.protocol.definitions import MATRICES, STATED
from int8alibi.errors import ProtocolError
from int8alibi.files.parquet import read_table
from int8alibi.analysis.scoring import (CELLS_KEY, NOT_APPLICABLE, OUTCOMES, UNOBSERVABLE, cells_table, definition_scores,
                                        score)
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


def _stated_counts(cells: pd.DataFrame) -> pd.DataFrame:
    """The stated scorecard's counts, tallied straight off the cells table's score columns."""
    records = []
    for matrix in MATRICES:
        for check, group in cells.groupby("check", sort=True):
            scores = group[f"score_{matrix}"]
            misses = group[f"predicted_miss_{matrix}"] & (scores == "TN")
            records.append({"matrix": matrix, "check": int(check),
                            **{k.lower(): int((scores == k).sum()) for k in OUTCOMES},
                            "excluded_unobservable": int((scores == UNOBSERVABLE).sum()),
                            "not_applicable": int((scores == NOT_APPLICABLE).sum()),
                            "predicted_misses_silent": int(misses.sum())})
    return pd.DataFrame(records).set_index(["matrix", "check"]).sort_index()


def _agreement(rows: pd.DataFrame, protocol, tmp_path: Path) -> pd.DataFrame:
    """Write the campaign's tables from ``rows``; assert the cells' score columns and the stated
    scorecard agree row by row and in count; return the cells table as written."""
    written = write_tables(tmp_path, cells_table(score(rows, {m: protocol.matrix(m) for m in MATRICES}, False)),
                           protocol)
    cells = read_table(written["cells"], TABLES["cells"][1])
    card = read_table(written["scorecard"], TABLES["scorecard"][1])
    stated = card[card["definition"] == STATED.name].drop(columns="definition").set_index(["matrix", "check"])
    counted = _stated_counts(cells)
    assert counted.equals(stated[counted.columns].sort_index())
    per_row = definition_scores(cells, [STATED], {m: protocol.matrix(m) for m in MATRICES}, None)
    for matrix in MATRICES:
        part = per_row[per_row["matrix"] == matrix].reset_index(drop=True)
        assert part[CELLS_KEY].equals(cells[CELLS_KEY])
        assert part["score"].tolist() == cells[f"score_{matrix}"].tolist()
        assert part["prediction"].tolist() == cells[f"predicted_{matrix}"].tolist()
    return cells


def test_the_cells_score_columns_and_the_scorecard_agree(campaign_rows: pd.DataFrame, protocol,
                                                         tmp_path: Path) -> None:
    cells = _agreement(campaign_rows, protocol, tmp_path)
    # the campaign itself holds unobservable cells (F8), not-applicable checks (7) and every outcome
    for matrix in MATRICES:
        assert {UNOBSERVABLE, NOT_APPLICABLE, "TN"} <= set(cells[f"score_{matrix}"])
    # and the two matrices disagree on some cell x check (the corrections), so the tally is not one column twice
    assert (cells["score_corrected"] != cells["score_original"]).any()


def test_they_agree_on_every_verdict_a_cell_can_carry(campaign_rows: pd.DataFrame, protocol, tmp_path: Path) -> None:
    """The campaign's rows with verdicts and applicability rewritten so that every prediction meets
    every verdict, unobservable cells and checks that do not apply: fire and silent tie in count."""
    rows = campaign_rows.copy()
    n = len(rows)
    rows["observable"] = [i % 5 != 0 for i in range(n)]
    rows["applicable"] = [i % 7 != 0 for i in range(n)]
    rows["fired"] = pd.Series([None if i % 7 == 0 else i % 2 == 0 for i in range(n)], dtype=object)
    cells = _agreement(rows, protocol, tmp_path)
    for matrix in MATRICES:
        assert set(OUTCOMES) | {UNOBSERVABLE, NOT_APPLICABLE} == set(cells[f"score_{matrix}"])


def test_both_paths_refuse_an_applicable_check_without_a_verdict(campaign_rows: pd.DataFrame, protocol) -> None:
    rows = campaign_rows.copy()
    scored = (rows["observable"] & rows["applicable"]).to_numpy().nonzero()[0]
    rows["fired"] = rows["fired"].astype(object)
    rows.loc[rows.index[scored[0]], "fired"] = None
    matrices = {m: protocol.matrix(m) for m in MATRICES}
    with pytest.raises(ProtocolError, match="cannot score an applicable check without a verdict"):
        score(rows, matrices, False)
    with pytest.raises(ProtocolError, match="cannot score an applicable check without a verdict"):
        definition_scores(rows, [STATED], matrices, None)

"""SQLite: a statement's rows carried across as one row.

Python's sqlite3 hands rows back one ``sqlite3_step`` each and lets go of the GIL around
every step, so on a store thread each row waits to take the GIL back from the event loop:
up to its switch interval (1 ms) whenever the loop is busy. Reading 100,000 rows next to a
busy thread took 184 s instead of 0.8 s; a restart's requeue of 66,666 jobs returned with
RETURNING, 66 s instead of 1.7 s. ``in_one_row`` wraps a SELECT so that its rows come back
as one JSON array in one row, one step; ``rows_of`` turns it back into rows. Decoding that
costs more of the GIL than sqlite3's own rows (0.77 against 0.3 s for 100,000 of a restart's
page rows), so it is for rows read next to a busy loop where the wait would be worse: a
restart's requeue, not its page reads (they are read ahead, off the critical path). A REAL
goes across as its ``quote`` (exact: JSON's text would keep 15 digits); everything else as
its JSON value (TEXT as a string: a JSON column's text comes back as it is stored).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from broker.store.sql import Statement

# The store's REAL columns (migrations): what in_one_row quotes.
REAL_COLUMNS: Final = frozenset({"not_before", "created_at", "updated_at", "at"})


def in_one_row(statement: Statement, columns: Sequence[str]) -> Statement:
    """``statement`` (a SQLite SELECT whose result columns are named ``columns``) with all
    its rows as one JSON array of arrays, in one row. The array's order is not promised:
    callers that need one sort the rows."""
    each = ", ".join(f"quote({c})" if c in REAL_COLUMNS else c for c in columns)
    return Statement(
        "sqlite",
        f"SELECT json_group_array(json_array({each})) FROM ({statement.sql})",
        list(statement.args),
    )


def rows_of(text: str, columns: Sequence[str]) -> list[list[Any]]:
    """The rows of an ``in_one_row`` statement's one value, its REALs floats again."""
    rows: list[list[Any]] = json.loads(text)
    reals = [i for i, c in enumerate(columns) if c in REAL_COLUMNS]
    for row in rows:
        for i in reals:
            row[i] = real(row[i])
    return rows


def real(quoted: str) -> float | None:
    """A REAL as SQLite's ``quote`` gave it (``NULL`` for none)."""
    return None if quoted == "NULL" else float(quoted)


__all__ = ["REAL_COLUMNS", "in_one_row", "real", "rows_of"]

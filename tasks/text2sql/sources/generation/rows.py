"""Seeded rows for a domain, written into a DuckDB file.

Every random choice comes from a generator seeded by (seed, db_id, variant, table), so a database is a pure
function of those and rebuilding it gives the same contents.
"""

from __future__ import annotations

import csv
import datetime as dt
import random
import tempfile
from pathlib import Path

import duckdb

from tasks.text2sql.sources.domains.schema import FLIGHT_NUMBERS, Column, Domain, Role, Table
from tasks.text2sql.sources.seeding import derived_rng

# Share of parent rows that children may reference: the rest stay childless, so questions such as
# "which departments have no employees" have answers.
REFERENCED_SHARE = 0.85


def _pool_name(column: Column, rng: random.Random) -> str:
    if column.pool == FLIGHT_NUMBERS:
        return f"{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}{rng.randint(100, 9999)}"
    first, second = column.parts
    a, b = rng.choice(first), rng.choice(second)
    return f"{a}{b}" if b[0].islower() else f"{a} {b}"


def _draw_number(column: Column, rng: random.Random) -> float | int:
    if column.decimals == 0:
        return rng.randint(int(column.low), int(column.high))
    return round(rng.uniform(column.low, column.high), column.decimals)


def _draw_date(column: Column, rng: random.Random) -> str:
    first = dt.date(int(column.low), 1, 1)
    last = dt.date(int(column.high), 12, 31)
    return (first + dt.timedelta(days=rng.randint(0, (last - first).days))).isoformat()


class _ForeignKeyDraw:
    """Draws referenced ids with a skew, from a subset of the parent's ids."""

    def __init__(self, parent_rows: int, rng: random.Random) -> None:
        ids = list(range(1, parent_rows + 1))
        rng.shuffle(ids)
        self.ids = ids[: max(1, round(parent_rows * REFERENCED_SHARE))]
        # A mild power-law skew, so counts per parent differ enough for HAVING and "most" questions.
        self.weights = [1.0 / (rank + 1) ** 0.7 for rank in range(len(self.ids))]

    def draw(self, rng: random.Random) -> int:
        return rng.choices(self.ids, self.weights)[0]


def generate_rows(domain: Domain, table: Table, seed: int, variant: int) -> list[list[object]]:
    """The rows of one table, in column order; None stands for NULL."""
    rng = derived_rng(seed, domain.db_id, variant, table.name)
    fk_draws = {c.name: _ForeignKeyDraw(domain.table(c.references).rows, rng) for c in table.by_role(Role.FOREIGN_KEY)}
    category_weights = {c.name: [rng.uniform(0.3, 3.0) for _ in c.values] for c in table.by_role(Role.CATEGORY)}
    rows: list[list[object]] = []
    for index in range(table.rows):
        row: list[object] = []
        for column in table.columns:
            value: object
            if column.role is Role.ID:
                value = index + 1
            elif column.role is Role.FOREIGN_KEY:
                value = fk_draws[column.name].draw(rng)
            elif column.role is Role.LABEL:
                value = column.values[index] if column.values else _pool_name(column, rng)
            elif column.role is Role.CATEGORY:
                value = rng.choices(column.values, category_weights[column.name])[0]
            elif column.role is Role.NUMBER:
                value = _draw_number(column, rng)
            elif column.role is Role.DATE:
                value = _draw_date(column, rng)
            else:
                value = rng.random() < 0.4
            if column.null_fraction and rng.random() < column.null_fraction:
                value = None
            row.append(value)
        rows.append(row)
    return rows


def create_table_sql(domain: Domain, table: Table) -> str:
    """CREATE TABLE with primary and foreign keys."""
    lines = [f"{c.name} {c.sql_type}" + (" PRIMARY KEY" if c.role is Role.ID else "") for c in table.columns]
    lines += [
        f"FOREIGN KEY ({c.name}) REFERENCES {c.references}({domain.table(c.references).primary_key.name})"
        for c in table.by_role(Role.FOREIGN_KEY)
    ]
    body = ",\n  ".join(lines)
    return f"CREATE TABLE {table.name} (\n  {body}\n)"


def build_database(domain: Domain, seed: int, variant: int, path: Path) -> None:
    """Write the domain's tables, seeded for `variant`, into a new DuckDB file at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as scratch, duckdb.connect(str(path)) as con:
        for table in domain.tables:
            con.execute(create_table_sql(domain, table))
            csv_path = Path(scratch) / f"{table.name}.csv"
            with csv_path.open("w", newline="") as handle:
                writer = csv.writer(handle)
                for row in generate_rows(domain, table, seed, variant):
                    writer.writerow(["\\N" if v is None else v for v in row])
            con.execute(f"COPY {table.name} FROM '{csv_path}' (HEADER false, NULLSTR '\\N')")
        con.execute("CHECKPOINT")

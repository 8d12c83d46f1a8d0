"""How a database spells its tables and columns: the naming conventions real schemas have.

A style is drawn per database: snake_case, CamelCase, camelCase or UPPER_CASE; singular or plural table names;
prefixes (tbl_, t_, tblCustomer, dim_/fact_); abbreviations (qty, amt, dt); keys named id, <table>_id or <Table>ID;
and a share of columns with opaque names (attr3, col_2) that do not say what they hold.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from enum import StrEnum

import duckdb
import sqlglot
from sqlglot import exp

# Common abbreviations in real schemas; applied word by word when a style abbreviates.
ABBREVIATIONS = {
    "account": "acct",
    "address": "addr",
    "amount": "amt",
    "application": "app",
    "average": "avg",
    "balance": "bal",
    "building": "bldg",
    "capacity": "cap",
    "category": "cat",
    "certification": "cert",
    "code": "cd",
    "commission": "comm",
    "company": "co",
    "conference": "conf",
    "count": "cnt",
    "customer": "cust",
    "date": "dt",
    "department": "dept",
    "description": "descr",
    "distance": "dist",
    "duration": "dur",
    "employee": "emp",
    "estimated": "est",
    "experience": "exp",
    "identifier": "id",
    "information": "info",
    "installed": "inst",
    "invoice": "inv",
    "location": "loc",
    "maintenance": "maint",
    "manager": "mgr",
    "measurement": "meas",
    "medication": "med",
    "message": "msg",
    "minutes": "mins",
    "number": "num",
    "organization": "org",
    "payment": "pmt",
    "percent": "pct",
    "population": "pop",
    "position": "pos",
    "price": "prc",
    "product": "prod",
    "professor": "prof",
    "purchase": "purch",
    "quantity": "qty",
    "rating": "rtg",
    "reference": "ref",
    "registered": "reg",
    "registration": "reg",
    "researcher": "rsrchr",
    "schedule": "sched",
    "seconds": "secs",
    "sequence": "seq",
    "service": "svc",
    "session": "sess",
    "station": "stn",
    "status": "stat",
    "student": "stu",
    "subscriber": "subscr",
    "supervisor": "supv",
    "supplier": "supp",
    "total": "tot",
    "transaction": "txn",
    "vehicle": "veh",
    "warehouse": "whse",
    "weight": "wt",
    "years": "yrs",
}

# Names a column with an opaque name can take; {n} numbers the table's opaque columns.
OPAQUE_PATTERNS = ("attr{n}", "col_{n}", "f{n}", "field{n}", "x{n}", "val_{n}", "c{n}", "data{n}", "prop{n}", "misc{n}")


class Case(StrEnum):
    SNAKE = "snake"  # order_items
    PASCAL = "pascal"  # OrderItems
    CAMEL = "camel"  # orderItems
    UPPER = "upper"  # ORDER_ITEMS


class KeyStyle(StrEnum):
    """How the key of a table is named; foreign keys are named after the key they reference."""

    ID = "id"  # id, and customer_id for a foreign key
    TABLE_ID = "table_id"  # customer_id in both places
    TABLE_KEY = "table_key"  # customer_key (warehouse style)
    TABLE_NO = "table_no"  # customer_no


class Prefix(StrEnum):
    NONE = "none"
    TBL = "tbl"  # tbl_customer, tblCustomer
    T = "t"  # t_customer
    DIM_FACT = "dim_fact"  # dim_customer for a table others reference, fact_sale for one that only references


@dataclass(frozen=True)
class NamingStyle:
    """One database's naming convention."""

    table_case: Case
    column_case: Case
    plural_tables: bool
    prefix: Prefix
    abbreviate: bool
    key: KeyStyle
    # "ID" rather than "Id" in CamelCase keys (CustomerID).
    upper_id: bool
    # Labels named after their table: customer_name rather than name.
    qualified_labels: bool
    # Share of a table's plain attribute columns that get opaque names, and the pattern they follow.
    opaque_share: float
    opaque_pattern: str

    @staticmethod
    def draw(rng: random.Random) -> NamingStyle:
        """A style with the frequencies of the schemas people write: mostly snake_case and plain, often not."""
        table_case = rng.choices(list(Case), weights=(5, 3, 1, 1))[0]
        column_case = table_case if rng.random() < 0.8 else rng.choice(list(Case))
        prefix = rng.choices(list(Prefix), weights=(6, 2, 1, 1))[0]
        return NamingStyle(
            table_case=table_case,
            column_case=column_case,
            plural_tables=rng.random() < 0.6,
            prefix=prefix,
            abbreviate=rng.random() < 0.3,
            key=KeyStyle.TABLE_KEY if prefix is Prefix.DIM_FACT else rng.choices(list(KeyStyle), (5, 4, 0, 1))[0],
            upper_id=rng.random() < 0.6,
            qualified_labels=rng.random() < 0.3,
            opaque_share=rng.choice((0.0, 0.0, 0.15, 0.3)),
            opaque_pattern=rng.choice(OPAQUE_PATTERNS),
        )

    def words(self, concept: str) -> list[str]:
        """The words of a snake_case concept, abbreviated when the style abbreviates."""
        words = concept.split("_")
        return [ABBREVIATIONS.get(w, w) for w in words] if self.abbreviate else words

    def spell(self, words: list[str], case: Case) -> str:
        if case is Case.SNAKE:
            return "_".join(words)
        if case is Case.UPPER:
            return "_".join(words).upper()
        capitalised = [self._capitalise(w) for w in words]
        if case is Case.CAMEL:
            capitalised[0] = words[0]
        return "".join(capitalised)

    def _capitalise(self, word: str) -> str:
        if word == "id":
            return "ID" if self.upper_id else "Id"
        return word[:1].upper() + word[1:]

    def table_name(self, concept: str, plural: str, referenced: bool) -> str:
        words = self.words(plural if self.plural_tables else concept)
        name = self.spell(words, self.table_case)
        if self.prefix is Prefix.NONE:
            return name
        marker = {Prefix.TBL: "tbl", Prefix.T: "t"}.get(self.prefix) or ("dim" if referenced else "fact")
        if self.table_case in (Case.PASCAL, Case.CAMEL):
            return marker + self.spell(words, Case.PASCAL)
        return self.spell([marker, *words], self.table_case)

    def key_name(self, table_concept: str) -> str:
        """The key column of a table."""
        if self.key is KeyStyle.ID:
            return self.spell(["id"], self.column_case)
        suffix = {KeyStyle.TABLE_ID: "id", KeyStyle.TABLE_KEY: "key", KeyStyle.TABLE_NO: "no"}[self.key]
        return self.spell([*self.words(table_concept), suffix], self.column_case)

    def reference_name(self, role: str) -> str:
        """A column that holds another row's key, for the role it plays ("owner", "attending_vet")."""
        suffix = {KeyStyle.ID: "id", KeyStyle.TABLE_ID: "id", KeyStyle.TABLE_KEY: "key", KeyStyle.TABLE_NO: "no"}
        return self.spell([*self.words(role), suffix[self.key]], self.column_case)

    def column_name(self, concept: str, table_concept: str, label: bool) -> str:
        words = self.words(concept)
        if label and self.qualified_labels:
            words = [*self.words(table_concept), *words]
        return self.spell(words, self.column_case)

    def opaque_name(self, n: int) -> str:
        return self.spell(self.opaque_pattern.format(n=n).split("_"), self.column_case)


@functools.cache
def _reserved_words() -> frozenset[str]:
    """Words DuckDB does not take as an unquoted column or table name."""
    with duckdb.connect(":memory:") as con:
        rows = con.execute(
            "SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category IN ('reserved', 'type_function')"
        ).fetchall()
    return frozenset(word for (word,) in rows)


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@functools.lru_cache(maxsize=4096)
def is_plain_identifier(name: str) -> bool:
    """Whether `name` can stand unquoted in DuckDB and reads back from sqlglot as the same column and table."""
    if not _IDENTIFIER.fullmatch(name) or name.lower() in _reserved_words():
        return False
    try:
        tree = sqlglot.parse_one(f"SELECT a.{name}, {name} FROM {name} AS a", read="duckdb")
    except sqlglot.errors.ParseError:
        return False
    columns = [e for e in tree.expressions if isinstance(e, exp.Column)]
    table = tree.find(exp.Table)
    return len(columns) == 2 and all(c.name == name for c in columns) and table is not None and table.name == name

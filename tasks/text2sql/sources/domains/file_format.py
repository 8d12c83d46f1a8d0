"""The domain files' format: what a file may say, checked once as it is read.

A domain file (`bundled/retail.yaml`, `synthesized/veterinary.yaml`; the file's name is the domain's) holds a
description and its tables, in the order they are built. A table has a name, its nouns, its row count and its
columns; every table gets an integer key `id` first, and each column is a mapping with a `kind`:

    description: "An online shop: customers, products, orders and the items in them."
    tables:
      - name: customers
        singular: customer
        rows: 600
        columns:
          - {name: name, kind: label, pool: person}
          - {name: city, kind: category, values: {list: cities, stop: 12}, equals_phrases: ['live in {v}']}
          - {name: signup_date, kind: date, phrase: signup date, first_year: 2016, last_year: 2024}

A column's `phrase`, its words in a question, is by default its name in words ("signup date"); a key's is its name
without `_id` ("customer_id": "customer"). A table's `singular` is by default its name in words, its `plural` the
English plural of that. `pools.yaml` holds what several domains share: word lists, named as `{list: cities}` and
sliced as Python slices are (`{list: cities, start: 5, stop: 15}`), and the pools that labels draw a name from per
row (`pool: person`).

Values are strings: quote those YAML would read as something else ('yes', 'no', '12', 'null'), and phrases with
{v} in a flow list; an unquoted one is refused, never silently converted.

In a synthesized domain a table's and a column's name is a concept ("pet", "weight_kg") that each database spells in
its own naming style; in a bundled one it is the name in SQL.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, RootModel, StringConstraints, model_validator

from tasks.text2sql.sources.domains.schema import FLIGHT_NUMBERS

Name = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")]
KeyName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*_id$")]
Word = Annotated[str, StringConstraints(min_length=1)]
Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]
# A phrasing of a filter on a value, with {v} where the value goes: "live in {v}", "cost more than {v}".
ValuePhrase = Annotated[str, StringConstraints(pattern=r"\{v\}")]
# A phrasing of a flag being true, which has no value to place: "are vegetarian".
FlagPhrase = Annotated[str, StringConstraints(pattern=r"^[^{}]+$")]


class _Strict(BaseModel):
    """Unknown fields are errors, so a misspelt field is never silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ListSlice(_Strict):
    """Part of a word list of `pools.yaml`, as a Python slice: `{list: cities, start: 5, stop: 15}`."""

    list_name: Name = Field(alias="list")
    start: int = Field(default=0, ge=0)
    stop: int | None = Field(default=None, gt=0)


# Words written out, or taken from a shared list.
Words = list[Word] | ListSlice


class _ColumnSpec(_Strict):
    name: Name
    phrase: Word | None = None


class ForeignKeySpec(_ColumnSpec):
    """The id of a row of another table of the domain."""

    kind: Literal["foreign_key"]
    name: KeyName
    references: Name
    null_fraction: Fraction = 0.0


class SelfReferenceSpec(_ColumnSpec):
    """The id of another row of the same table (a manager, a parent category), NULL for the roots."""

    kind: Literal["self_reference"]
    name: KeyName


class LabelSpec(_ColumnSpec):
    """What a person calls a row, from exactly one source:

    - `pool`: a name drawn per row from a pool of `pools.yaml` ("person") or a flight number ("flight");
    - `values`: fixed names, one row each (the table's row count);
    - `parts`: one or two word lists composed into names once ("Oak" + "Clinic", "Amoxi" + "cillin"), distinct
      per row while the combinations last;
    - `code`: a prefix for distinct codes ("INV" gives "INV-4821").
    """

    kind: Literal["label"]
    pool: Name | None = None
    values: list[Word] | None = Field(default=None, min_length=1)
    parts: list[Words] | None = Field(default=None, min_length=1, max_length=2)
    code: Word | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        given = [s for s in ("pool", "values", "parts", "code") if getattr(self, s) is not None]
        if len(given) != 1:
            raise ValueError(f"a label takes exactly one of pool, values, parts or code (given: {given or 'none'})")
        return self


class CategorySpec(_ColumnSpec):
    """One of a small set of values, drawn with weights of its own per table and variant."""

    kind: Literal["category"]
    values: Words
    equals_phrases: list[ValuePhrase] = []
    null_fraction: Fraction = 0.0


class NumberSpec(_ColumnSpec):
    """A measured quantity, uniform between `low` and `high`; an integer unless it has `decimals`."""

    kind: Literal["number"]
    low: float
    high: float
    decimals: int = Field(default=0, ge=0, le=6)
    # Whether a total makes sense (prices, quantities) or not (years, ratings, rates).
    additive: bool = True
    above_phrases: list[ValuePhrase] = []
    below_phrases: list[ValuePhrase] = []
    null_fraction: Fraction = 0.0

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) is above high ({self.high})")
        return self


class DateSpec(_ColumnSpec):
    """A day between the first of January of `first_year` and the last of December of `last_year`."""

    kind: Literal["date"]
    first_year: int = Field(ge=1000, le=9999)
    last_year: int = Field(ge=1000, le=9999)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.first_year > self.last_year:
            raise ValueError(f"first_year ({self.first_year}) is after last_year ({self.last_year})")
        return self


class FlagSpec(_ColumnSpec):
    """A boolean; with `equals_phrases` questions can filter on it in words."""

    kind: Literal["flag"]
    equals_phrases: list[FlagPhrase] = []


ColumnSpec = Annotated[
    ForeignKeySpec | SelfReferenceSpec | LabelSpec | CategorySpec | NumberSpec | DateSpec | FlagSpec,
    Field(discriminator="kind"),
]


class TableSpec(_Strict):
    name: Name
    singular: Word | None = None
    plural: Word | None = None
    # Required unless a label has fixed values, whose count it is then.
    rows: int | None = Field(default=None, gt=0)
    columns: list[ColumnSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = [c.name for c in self.columns]
        if "id" in names or len(set(names)) != len(names):
            raise ValueError(f"table {self.name}: column names must be distinct and not `id`, the key ({names})")
        fixed = {len(c.values) for c in self.columns if isinstance(c, LabelSpec) and c.values is not None}
        if len(fixed) > 1:
            raise ValueError(f"table {self.name}: labels with fixed values must have as many each ({sorted(fixed)})")
        if (self.rows is None) == (not fixed):
            raise ValueError(f"table {self.name}: give `rows`, or a label with fixed values (one row each), not both")
        return self

    @property
    def row_count(self) -> int:
        fixed = [c.values for c in self.columns if isinstance(c, LabelSpec) and c.values is not None]
        return len(fixed[0]) if fixed else self.rows or 0


class DomainSpec(_Strict):
    description: Word
    tables: list[TableSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _references_resolve(self) -> Self:
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be distinct ({names})")
        for table in self.tables:
            for column in table.columns:
                if isinstance(column, ForeignKeySpec) and column.references not in names:
                    raise ValueError(f"{table.name}.{column.name} references {column.references!r}, not a table here")
                if isinstance(column, ForeignKeySpec) and column.references == table.name:
                    raise ValueError(f"{table.name}.{column.name}: a key into its own table is a self_reference")
        return self


class PoolsSpec(_Strict):
    """`pools.yaml`: word lists by name, and the pools names are drawn from per row, one word from each part."""

    lists: dict[Name, list[Word]]
    names: dict[Name, tuple[Words, Words]]

    @model_validator(mode="after")
    def _references_resolve(self) -> Self:
        if FLIGHT_NUMBERS in self.names:
            raise ValueError(f"the pool {FLIGHT_NUMBERS!r} is built in (flight numbers): name yours otherwise")
        for pool, parts in self.names.items():
            for part in parts:
                if isinstance(part, ListSlice) and part.list_name not in self.lists:
                    raise ValueError(f"the pool {pool!r} names the list {part.list_name!r}, which `lists` lacks")
        return self


class SplitsSpec(RootModel[dict[Name, list[Name]]]):
    """A family's `splits.yaml`: its domains by split, in build order; a domain is in one split only."""

    @model_validator(mode="after")
    def _disjoint(self) -> Self:
        listed = [name for names in self.root.values() for name in names]
        if len(set(listed)) != len(listed):
            raise ValueError(f"a domain is listed twice ({sorted(n for n in set(listed) if listed.count(n) > 1)})")
        return self

"""Reads a family's domain files into `schema.Domain`s: shared lists looked up, defaults filled in, composed labels
drawn, so that the generators see every domain in one resolved form."""

from __future__ import annotations

import functools
import itertools
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar, assert_never

import yaml
from pydantic import BaseModel, ValidationError

from tasks.text2sql.errors import DomainFileError
from tasks.text2sql.sources.domains.file_format import (
    CategorySpec,
    ColumnSpec,
    DateSpec,
    DomainSpec,
    FlagSpec,
    ForeignKeySpec,
    LabelSpec,
    ListSlice,
    NumberSpec,
    PoolsSpec,
    SelfReferenceSpec,
    SplitsSpec,
    TableSpec,
    Words,
)
from tasks.text2sql.sources.domains.schema import FLIGHT_NUMBERS, Column, Domain, Role, Table
from tasks.text2sql.sources.seeding import derived_rng

DOMAINS_DIR = Path(__file__).resolve().parent
POOLS_FILE = "pools.yaml"
SPLITS_FILE = "splits.yaml"
# The share of rows whose self-reference is NULL: the roots (a top manager, a top-level category).
SELF_REFERENCE_NULLS = 0.15
# libyaml's parser where PyYAML has it: it reads the domain files in a tenth of the pure-Python parser's time.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Model = TypeVar("_Model", bound=BaseModel)


class Family(StrEnum):
    """A folder of domain files and the generator that reads it."""

    BUNDLED = "bundled"  # the databases of the bundled question files
    SYNTHESIZED = "synthesized"  # the domains the synthesized databases are drawn from


def load_family(family: Family, root: Path = DOMAINS_DIR) -> dict[str, tuple[Domain, ...]]:
    """The family's domains by split, in the order its `splits.yaml` lists them; `root` holds `pools.yaml` and a
    folder per family.

    Raises:
        DomainFileError: a file that does not parse or validate, a name that no list, pool or file has, or a domain
            file that the splits leave out.
    """
    return dict(_load_family(family, root))


def family_files(family: Family) -> tuple[Path, ...]:
    """Every file that decides the family's domains, the loader's code included, for the fingerprints of caches."""
    folder = DOMAINS_DIR / family
    return (*sorted(DOMAINS_DIR.glob("*.py")), DOMAINS_DIR / POOLS_FILE, *sorted(folder.glob("*.yaml")))


@functools.cache
def _load_family(family: Family, root: Path) -> tuple[tuple[str, tuple[Domain, ...]], ...]:
    folder = root / family
    splits = _read(folder / SPLITS_FILE, SplitsSpec).root
    files = {path.stem for path in folder.glob("*.yaml") if path.name != SPLITS_FILE}
    listed = {name for names in splits.values() for name in names}
    if listed != files:
        raise DomainFileError(
            f"{folder / SPLITS_FILE} must list every domain file of {folder} once: "
            f"listed without a file {sorted(listed - files)}, files not listed {sorted(files - listed)}"
        )
    pools = _read(root / POOLS_FILE, PoolsSpec)
    return tuple(
        (split, tuple(_domain(name, folder / f"{name}.yaml", pools) for name in names))
        for split, names in splits.items()
    )


def _read(path: Path, model: type[_Model]) -> _Model:
    try:
        data: Any = yaml.load(path.read_text(), Loader=_YAML_LOADER)
        return model.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as error:
        raise DomainFileError(f"{path} does not load: {error}") from None


def _domain(name: str, path: Path, pools: PoolsSpec) -> Domain:
    spec = _read(path, DomainSpec)
    words = _Words(pools, path)
    return Domain(name, spec.description, tuple(_table(table, words) for table in spec.tables))


class _Words:
    """Looks up the shared lists and pools a domain file names, saying which file named a missing one."""

    def __init__(self, pools: PoolsSpec, path: Path) -> None:
        self.pools = pools
        self.path = path

    def of(self, words: Words, where: str) -> tuple[str, ...]:
        if not isinstance(words, ListSlice):
            return tuple(words)
        if words.list_name not in self.pools.lists:
            raise DomainFileError(
                f"{self.path}: {where} names the list {words.list_name!r}; {POOLS_FILE} has {sorted(self.pools.lists)}"
            )
        chosen = tuple(self.pools.lists[words.list_name][words.start : words.stop])
        if not chosen:
            raise DomainFileError(f"{self.path}: {where} takes nothing of the list {words.list_name!r}")
        return chosen

    def pool_parts(self, pool: str, where: str) -> tuple[tuple[str, ...], ...]:
        if pool == FLIGHT_NUMBERS:
            return ()
        if pool not in self.pools.names:
            raise DomainFileError(
                f"{self.path}: {where} draws from the pool {pool!r}; {POOLS_FILE} has "
                f"{sorted(self.pools.names)} and {FLIGHT_NUMBERS!r}"
            )
        return tuple(self.of(part, f"{POOLS_FILE}'s pool {pool!r}") for part in self.pools.names[pool])


def _table(spec: TableSpec, words: _Words) -> Table:
    singular = spec.singular or _in_words(spec.name)
    rows = spec.row_count
    key = Column("id", "INTEGER", Role.ID)
    columns = tuple(_column(column, spec.name, rows, words) for column in spec.columns)
    return Table(spec.name, singular, spec.plural or plural_of(singular), (key, *columns), rows)


def _column(spec: ColumnSpec, table: str, rows: int, words: _Words) -> Column:
    where, phrase = f"{table}.{spec.name}", _phrase(spec)
    match spec:
        case ForeignKeySpec():
            return Column(
                spec.name,
                "INTEGER",
                Role.FOREIGN_KEY,
                phrase=phrase,
                references=spec.references,
                null_fraction=spec.null_fraction,
            )
        case SelfReferenceSpec():
            # Filled as a number from 1 to the row count, without a declared foreign key: DuckDB checks a
            # self-referencing key row by row while loading, and seeded rows point forward as often as back.
            return Column(
                spec.name,
                "INTEGER",
                Role.NUMBER,
                phrase=phrase,
                low=1,
                high=rows,
                references=table,
                additive=False,
                null_fraction=SELF_REFERENCE_NULLS,
            )
        case LabelSpec():
            if spec.pool is not None:
                parts = words.pool_parts(spec.pool, where)
                return Column(spec.name, "VARCHAR", Role.LABEL, phrase=phrase, pool=spec.pool, parts=parts)
            return Column(
                spec.name, "VARCHAR", Role.LABEL, phrase=phrase, values=_label_values(spec, table, rows, words)
            )
        case CategorySpec():
            return Column(
                spec.name,
                "VARCHAR",
                Role.CATEGORY,
                phrase=phrase,
                values=words.of(spec.values, where),
                equals_phrases=tuple(spec.equals_phrases),
                null_fraction=spec.null_fraction,
            )
        case NumberSpec():
            return Column(
                spec.name,
                "INTEGER" if spec.decimals == 0 else f"DECIMAL(12,{spec.decimals})",
                Role.NUMBER,
                phrase=phrase,
                low=spec.low,
                high=spec.high,
                decimals=spec.decimals,
                above_phrases=tuple(spec.above_phrases),
                below_phrases=tuple(spec.below_phrases),
                null_fraction=spec.null_fraction,
                additive=spec.additive,
            )
        case DateSpec():
            return Column(spec.name, "DATE", Role.DATE, phrase=phrase, low=spec.first_year, high=spec.last_year)
        case FlagSpec():
            return Column(spec.name, "BOOLEAN", Role.FLAG, phrase=phrase, equals_phrases=tuple(spec.equals_phrases))
        case _:
            assert_never(spec)


def _phrase(spec: ColumnSpec) -> str:
    """The column's words in a question; by default its name in words, a key's without `_id`."""
    if spec.phrase:
        return spec.phrase
    is_key = isinstance(spec, ForeignKeySpec | SelfReferenceSpec)
    return _in_words(spec.name.removesuffix("_id") if is_key else spec.name)


def _label_values(spec: LabelSpec, table: str, rows: int, words: _Words) -> tuple[str, ...]:
    """Fixed values as written; composed ones distinct while the word parts allow, as names of things are, and
    beyond that repeating, as headlines and menu items do in real data."""
    if spec.values is not None:
        return tuple(spec.values)
    rng = derived_rng("labels", table, spec.name)
    if spec.code is not None:
        return tuple(f"{spec.code}-{n}" for n in rng.sample(range(1000, 10000), rows))
    parts = (words.of(part, f"{table}.{spec.name}") for part in spec.parts or ())
    names = [functools.reduce(_compose, combination) for combination in itertools.product(*parts)]
    return tuple(rng.sample(names, rows) if len(names) >= rows else rng.choices(names, k=rows))


def _compose(first: str, second: str) -> str:
    """'Oak' + 'Clinic' is 'Oak Clinic'; a second part that is one lower-case word or starts with a hyphen is a
    suffix ('Amoxi' + 'cillin', 'core' + '-service')."""
    suffix = second[0] == "-" or (second[0].islower() and " " not in second)
    return first + second if suffix else f"{first} {second}"


def _in_words(name: str) -> str:
    return name.replace("_", " ")


def plural_of(noun: str) -> str:
    """English plural of the last word of a noun."""
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in tuple("aeiou"):
        return noun[:-1] + "ies"
    return noun + "s"

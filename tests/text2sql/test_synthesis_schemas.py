"""The synthesized data's schemas: breadth (databases, domains, tables, foreign-key chains), the naming real schemas
have, and none of the held-out domains."""

from __future__ import annotations

import re
from collections import Counter

from tasks.text2sql.sources.domains.loader import Family, load_family
from tasks.text2sql.sources.domains.schema import Role
from tasks.text2sql.sources.synthesis.build import SEED
from tasks.text2sql.sources.synthesis.naming import ABBREVIATIONS, is_plain_identifier
from tasks.text2sql.sources.synthesis.schemas import SynthDatabase, synth_databases

DATABASES = synth_databases(SEED)
TRAIN_SYNTH_DOMAINS = load_family(Family.SYNTHESIZED)["train"]
BUNDLED = load_family(Family.BUNDLED)
DEV_DOMAINS, TEST_DOMAINS = BUNDLED["dev"], BUNDLED["test"]


def _longest_chain(database: SynthDatabase) -> int:
    """Foreign keys in the longest chain table → parent → grandparent …"""
    parents = {t.name: [c.references for c in t.columns if c.role is Role.FOREIGN_KEY] for t in database.schema.tables}

    def depth(name: str) -> int:
        return max((1 + depth(parent) for parent in parents[name]), default=0)

    return max(depth(name) for name in parents)


def test_there_are_over_a_hundred_databases_across_thirty_domains() -> None:
    assert len(DATABASES) >= 100
    assert len({d.domain for d in DATABASES}) >= 30
    assert len({d.db_id for d in DATABASES}) == len(DATABASES)


def test_databases_have_two_to_twelve_tables_and_both_ends_occur() -> None:
    sizes = Counter(len(d.schema.tables) for d in DATABASES)
    assert min(sizes) == 2 and max(sizes) == 12
    assert len(sizes) >= 8, sizes


def test_every_domain_has_a_foreign_key_chain_of_three() -> None:
    full_schemas = [d for d in DATABASES if d.db_id.endswith("_1")]
    assert len(full_schemas) == len(TRAIN_SYNTH_DOMAINS)
    assert all(_longest_chain(d) >= 3 for d in full_schemas), [d.db_id for d in full_schemas if _longest_chain(d) < 3]


def test_table_names_follow_many_conventions() -> None:
    names = [t.name for d in DATABASES for t in d.schema.tables]
    conventions = {
        "snake_case": r"[a-z]+(_[a-z]+)+",
        "PascalCase": r"(?:[A-Z][a-z]+){2,}",
        "camelCase": r"[a-z]+(?:[A-Z][a-z]+)+",
        "UPPER_CASE": r"[A-Z]+(_[A-Z]+)+",
        "tbl_ prefix": r"tbl_\w+",
        "t_ prefix": r"t_\w+",
        "tblCamel prefix": r"tbl[A-Z]\w+",
        "dim_/fact_ prefix": r"(dim|fact)_\w+",
    }
    for convention, pattern in conventions.items():
        assert any(re.fullmatch(pattern, name) for name in names), convention
    singular = sum(not d.style.plural_tables for d in DATABASES)
    assert 0 < singular < len(DATABASES)


def test_column_names_use_abbreviations_several_key_styles_and_opaque_names() -> None:
    columns = [c.name for d in DATABASES for t in d.schema.tables for c in t.columns]
    words = {w for name in columns for w in re.split(r"_|(?<=[a-z])(?=[A-Z])", name.lower())}
    assert len(words & set(ABBREVIATIONS.values())) >= 15
    keys = {t.primary_key.name for d in DATABASES for t in d.schema.tables}
    assert {"id", "ID", "Id"} & keys and any(k.endswith("_id") for k in keys) and any(k.endswith("ID") for k in keys)
    opaque = [d for d in DATABASES if d.opaque]
    assert len(opaque) >= 30
    for database in opaque:
        for table_name, column_name in database.opaque:
            table = database.schema.table(table_name)
            column = next(c for c in table.columns if c.name == column_name)
            # An opaque name says nothing of what the column holds; its meaning is kept for the hint.
            assert not set(column.phrase.split()) & set(re.split(r"_|(?<=[a-z])(?=[A-Z])", column_name.lower()))
            assert column.phrase in database.meaning(table, column)


def test_every_name_stands_unquoted_and_is_unique_in_its_table() -> None:
    for database in DATABASES:
        assert len({t.name.lower() for t in database.schema.tables}) == len(database.schema.tables)
        for table in database.schema.tables:
            assert is_plain_identifier(table.name), table.name
            assert all(is_plain_identifier(c.name) for c in table.columns), table.name
            assert len({c.name.lower() for c in table.columns}) == len(table.columns), table.name


def test_subsets_keep_every_referenced_table() -> None:
    for database in DATABASES:
        names = {t.name for t in database.schema.tables}
        for table in database.schema.tables:
            assert {c.references for c in table.columns if c.references} <= names


def test_no_held_out_domain_or_table_is_among_them() -> None:
    held_out = DEV_DOMAINS + TEST_DOMAINS
    held_out_tables = {t.name for d in held_out for t in d.tables} | {t.singular for d in held_out for t in d.tables}
    concepts = {t.singular.replace(" ", "_") for d in DATABASES for t in d.schema.tables}
    plurals = {t.plural.replace(" ", "_") for d in DATABASES for t in d.schema.tables}
    assert not (concepts | plurals) & held_out_tables
    assert not {d.db_id for d in DATABASES} & {d.db_id for d in held_out}
    assert not {d.domain for d in DATABASES} & {d.db_id for d in held_out}


def test_the_same_seed_gives_the_same_databases_and_another_seed_other_styles() -> None:
    rebuilt = synth_databases.__wrapped__(SEED)
    assert rebuilt == DATABASES
    other = synth_databases.__wrapped__(SEED + 1)
    assert [d.style for d in other] != [d.style for d in DATABASES]

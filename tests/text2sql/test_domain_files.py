"""The domain files: both families load through one format into the schemas the shipped data was built from, a
default fills what a file leaves out, and a file that says something wrong is refused with where and why."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from tasks.text2sql.errors import DomainFileError
from tasks.text2sql.sources.domains.loader import Family, load_family
from tasks.text2sql.sources.domains.schema import Domain, Role
from tasks.text2sql.sources.synthesis.databases import database_digests, ensure_synth_databases
from tasks.text2sql.sources.synthesis.loader import read_manifest
from tasks.text2sql.sources.synthesis.manifest import QUESTIONS_FILE

# What the shipped domain files resolve to. The bundled question files and the synthesized manifest were built from
# exactly these schemas: a change here changes the data, so rebuild it (`python -m tasks.text2sql rebuild`,
# `build-data`) and then write the new digest.
RESOLVED_DIGESTS = {Family.BUNDLED: "ecb7f1d5fb811eb9", Family.SYNTHESIZED: "65aa5c17c87668a1"}
# The smallest database the shipped synthesized questions were written over (four tables, 1,546 rows).
SMALL_SHIPPED_DATABASE = "museum_2"

POOLS = """\
lists:
  cities: [Berlin, Lagos, Osaka, Toronto]
names:
  person: [[Ada, Alan], [Lovelace, Turing]]
"""
SHOP = """\
description: A shop.
tables:
  - name: customer
    rows: 5
    columns:
      - {name: name, kind: label, pool: person}
      - {name: city, kind: category, values: {list: cities, start: 1, stop: 3}}
      - {name: referrer_id, kind: self_reference}
  - name: product_line
    columns:
      - {name: title, kind: label, values: [Tools, Toys, Books]}
  - name: sale
    rows: 20
    columns:
      - {name: customer_id, kind: foreign_key, references: customer}
      - {name: line_id, kind: foreign_key, phrase: product line, references: product_line}
      - {name: receipt, kind: label, code: R}
      - {name: gift_tag, kind: label, parts: [[Happy, Merry], [Day, Year]]}
      - {name: unit_price, kind: number, low: 1, high: 9, decimals: 2, additive: false}
"""


def _resolved_digest(family: Family) -> str:
    splits = load_family(family)
    resolved = {split: [dataclasses.asdict(d) for d in domains] for split, domains in splits.items()}
    text = json.dumps(resolved, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _root(tmp_path: Path, domains: dict[str, str], splits: str = "", pools: str = POOLS) -> Path:
    """A folder of domain files: pools.yaml and a bundled family of `domains`, listed in its splits by default."""
    folder = tmp_path / Family.BUNDLED
    folder.mkdir(parents=True)
    (tmp_path / "pools.yaml").write_text(pools)
    (folder / "splits.yaml").write_text(splits or f"train: [{', '.join(domains)}]\n")
    for name, text in domains.items():
        (folder / f"{name}.yaml").write_text(text)
    return tmp_path


def _shop(tmp_path: Path) -> Domain:
    return load_family(Family.BUNDLED, _root(tmp_path, {"shop": SHOP}))["train"][0]


def test_both_families_load_through_the_one_format() -> None:
    bundled, synthesized = load_family(Family.BUNDLED), load_family(Family.SYNTHESIZED)
    assert {split: len(domains) for split, domains in bundled.items()} == {"train": 8, "dev": 2, "test": 2}
    assert [d.db_id for d in bundled["train"][:2]] == ["retail", "hospital"]
    assert list(synthesized) == ["train"] and len(synthesized["train"]) == 41
    assert synthesized["train"][0].db_id == "veterinary"


@pytest.mark.parametrize("family", list(Family))
def test_the_files_resolve_to_the_schemas_the_shipped_data_was_built_from(family: Family) -> None:
    assert _resolved_digest(family) == RESOLVED_DIGESTS[family], (
        f"the {family} domains changed: rebuild the data they make, then update RESOLVED_DIGESTS"
    )


def test_a_shipped_synthesized_database_still_builds_to_its_manifest_digest(tmp_path: Path) -> None:
    manifest = read_manifest(QUESTIONS_FILE)
    ensure_synth_databases(manifest.seed, [SMALL_SHIPPED_DATABASE], tmp_path, show_progress=False)
    built = database_digests(manifest.seed, [SMALL_SHIPPED_DATABASE], tmp_path)
    assert built[SMALL_SHIPPED_DATABASE] == manifest.databases[SMALL_SHIPPED_DATABASE]


def test_defaults_fill_nouns_phrases_and_the_key(tmp_path: Path) -> None:
    customer, product_line, sale = _shop(tmp_path).tables
    assert (sale.singular, sale.plural, product_line.plural) == ("sale", "sales", "product lines")
    assert [c.name for c in sale.columns][:2] == ["id", "customer_id"] and sale.primary_key.role is Role.ID
    assert [c.phrase for c in sale.columns[1:]] == ["customer", "product line", "receipt", "gift tag", "unit price"]
    assert sale.columns[-1].sql_type == "DECIMAL(12,2)" and not sale.columns[-1].additive
    assert customer.columns[2].values == ("Lagos", "Osaka")
    assert customer.label is not None and customer.label.parts == (("Ada", "Alan"), ("Lovelace", "Turing"))


def test_row_counts_and_self_references_resolve(tmp_path: Path) -> None:
    customer, product_line, sale = _shop(tmp_path).tables
    assert (customer.rows, product_line.rows, sale.rows) == (5, 3, 20)
    referrer = customer.columns[-1]
    assert (referrer.role, referrer.references, referrer.low, referrer.high) == (Role.NUMBER, "customer", 1, 5)
    assert sale.parents() == ("customer", "product_line")


def test_composed_labels_are_distinct_while_the_combinations_last_and_codes_always(tmp_path: Path) -> None:
    sale = _shop(tmp_path).tables[2]
    receipts, tags = sale.columns[3].values, sale.columns[4].values
    assert len(set(receipts)) == 20 and all(r.startswith("R-") for r in receipts)
    assert len(tags) == 20 and set(tags) == {"Happy Day", "Happy Year", "Merry Day", "Merry Year"}
    assert _shop(tmp_path / "again").tables[2] == sale  # seeded by the table's and column's names


@pytest.mark.parametrize(
    ("column", "complaint"),
    [
        ("{name: size, kind: sizes, values: [s, m]}", "does not match any of the expected tags"),
        ("{name: size, kind: category, value: [s, m]}", "Extra inputs are not permitted"),
        ("{name: answer, kind: category, values: [yes, no]}", "Input should be a valid string"),
        ("{name: size, kind: category, values: [s], equals_phrases: [are small]}", "should match pattern"),
        ("{name: tag, kind: label, pool: person, code: T}", "exactly one of pool, values, parts or code"),
        ("{name: shop_id, kind: foreign_key, references: shop}", "references 'shop', not a table here"),
        ("{name: price, kind: number, low: 9, high: 1}", "low (9.0) is above high (1.0)"),
    ],
)
def test_a_column_that_says_something_wrong_is_refused_with_its_place(
    tmp_path: Path, column: str, complaint: str
) -> None:
    text = f"description: A shop.\ntables:\n  - name: item\n    rows: 3\n    columns:\n      - {column}\n"
    with pytest.raises(DomainFileError, match=r"shop\.yaml") as refused:
        load_family(Family.BUNDLED, _root(tmp_path, {"shop": text}))
    assert complaint in str(refused.value)


def test_a_table_needs_its_rows_from_exactly_one_place(tmp_path: Path) -> None:
    both = SHOP.replace("  - name: product_line\n", "  - name: product_line\n    rows: 4\n")
    with pytest.raises(DomainFileError, match="give `rows`, or a label with fixed values"):
        load_family(Family.BUNDLED, _root(tmp_path, {"shop": both}))


@pytest.mark.parametrize(
    ("edit", "complaint"),
    [
        (("{list: cities, start: 1, stop: 3}", "{list: towns}"), "names the list 'towns'; pools.yaml has ['cities']"),
        (("{list: cities, start: 1, stop: 3}", "{list: cities, start: 9}"), "takes nothing of the list 'cities'"),
        (("pool: person", "pool: pets"), "draws from the pool 'pets'"),
    ],
)
def test_a_list_or_pool_that_pools_yaml_lacks_is_named(tmp_path: Path, edit: tuple[str, str], complaint: str) -> None:
    with pytest.raises(DomainFileError, match=r"customer\.(city|name)") as refused:
        load_family(Family.BUNDLED, _root(tmp_path, {"shop": SHOP.replace(*edit)}))
    assert complaint in str(refused.value)


def test_a_pool_that_names_a_list_pools_yaml_lacks_is_refused(tmp_path: Path) -> None:
    pools = POOLS.replace("[[Ada, Alan], [Lovelace, Turing]]", "[{list: first_names}, [Lovelace]]")
    with pytest.raises(DomainFileError, match=r"(?s)pools\.yaml does not load.*the pool 'person' names the list"):
        load_family(Family.BUNDLED, _root(tmp_path, {"shop": SHOP}, pools=pools))


def test_the_splits_list_every_domain_file_once(tmp_path: Path) -> None:
    with pytest.raises(DomainFileError, match=r"files not listed \['shop'\]"):
        load_family(Family.BUNDLED, _root(tmp_path / "a", {"shop": SHOP}, splits="train: []\n"))
    with pytest.raises(DomainFileError, match="a domain is listed twice"):
        load_family(Family.BUNDLED, _root(tmp_path / "b", {"shop": SHOP}, splits="train: [shop]\ntest: [shop]\n"))

"""Spider and BIRD loaders: every kept gold query returns in DuckDB the rows it returns in SQLite."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import duckdb
import pytest
from support.spider_release import write_json, write_sqlite

from tasks.text2sql.dataset import Text2SqlDataset
from tasks.text2sql.errors import DatasetError
from tasks.text2sql.prompts import schema_ddl
from tasks.text2sql.sources.spider import (
    DUCKDB_CONFIG,
    REPAIR_BARE_COLUMN,
    REPAIR_CASE_INSENSITIVE_LIKE,
    REPAIR_DOUBLE_QUOTED_STRING,
    REPAIR_INTEGER_DIVISION,
    REPAIR_TEXT_COMPARISON,
    LoadReport,
    gold_checks,
    load_bird,
    load_spider,
)

# Like Spider's concert_singer: names with spaces and mixed case, a TEXT column of years, a
# TEXT singer id joined to an INTEGER one, blanks in an INTEGER column and words in another.
CONCERT_SINGER = """
CREATE TABLE singer ("Singer_ID" INTEGER PRIMARY KEY, "Name" TEXT, "Country" VARCHAR(20), "Age" INT,
                     "Net Worth" REAL);
CREATE TABLE concert ("Concert ID" INTEGER PRIMARY KEY, "concert_Name" TEXT, "Year" TEXT,
                      "Points" INTEGER, "Rating" INTEGER);
CREATE TABLE singer_in_concert ("concert_ID" INT, "Singer_ID" TEXT);
INSERT INTO singer VALUES (1, 'Alice', 'France', 31, 12.5), (2, 'Bob', 'Netherlands', 45, 3.25),
    (3, 'Kalinda', 'France', 28, 40.0), (4, 'dave', 'United States', NULL, NULL),
    (5, 'Eve', 'Netherlands', 53, 7.0);
INSERT INTO concert VALUES (1, 'Auditions', '2014', 7, 5), (2, 'Super bootcamp', '2014', '', 'N/A'),
    (3, 'Home Visits', '2015', 10, 3);
INSERT INTO singer_in_concert VALUES (1, '1'), (1, '2'), (2, '1'), (3, '1'), (3, '3');
"""

TRAIN_GOLDS = [
    ("How many singers are there?", "SELECT count(*) FROM singer"),
    ("Which singers are from France?", 'SELECT Name FROM singer WHERE Country = "France"'),
    ("Which singers have 'ali' in their name?", "SELECT Name FROM singer WHERE Name LIKE '%ali%'"),
    ("Which singers lack 'ALI' in their name?", "SELECT Name FROM singer WHERE Name NOT LIKE '%ALI%'"),
    ("What is a third of each singer's age?", "SELECT Name, Age / 3 FROM singer"),
    ("What is the average age, truncated?", "SELECT sum(Age) / count(Age) FROM singer"),
    (
        "Which singer sang in which concert?",
        "SELECT T1.Name, T2.concert_Name FROM singer AS T1 JOIN singer_in_concert AS T3 "
        'ON T1.Singer_ID = T3.Singer_ID JOIN concert AS T2 ON T2."Concert ID" = T3.concert_ID',
    ),
    (
        "Which countries have more than one singer?",
        "SELECT Country, count(*) FROM singer GROUP BY Country HAVING count(*) > 1",
    ),
    ("Who is the oldest singer, and how old?", "SELECT Name, max(Age) FROM singer"),
    (
        "Who sang in the most concerts?",
        "SELECT T1.Name FROM singer AS T1 JOIN singer_in_concert AS T2 ON T1.Singer_ID = T2.Singer_ID "
        "GROUP BY T2.Singer_ID ORDER BY count(*) DESC LIMIT 1",
    ),
    ("Which concerts were in 2014?", "SELECT concert_Name FROM concert WHERE Year = 2014"),
    ("What is the largest net worth?", 'SELECT "Net Worth" FROM singer ORDER BY "Net Worth" DESC LIMIT 1'),
    ("How many points in all?", "SELECT sum(Points) FROM concert"),
    ("Who is the youngest singer?", "SELECT Name FROM singer ORDER BY Age LIMIT 1"),
    ("Which singers are in their thirties?", "SELECT Name FROM singer WHERE Age LIKE '3%'"),
]
DEV_GOLDS = [
    ("How many concerts are there?", "SELECT count(*) FROM concert"),
    # julianday is SQLite's own; DuckDB has no function of that name.
    ("How many days since each concert year began?", "SELECT julianday('2020-01-01') - julianday(Year) FROM concert"),
    ("What is the name of every singer?", "SELECT Name FROM singer"),
]
BROKEN_ID = "spider-dev-1"


def _spider_records(golds: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"db_id": "concert_singer", "question": q, "query": sql} for q, sql in golds]


@pytest.fixture
def spider_root(tmp_path: Path) -> Path:
    root = tmp_path / "spider"
    write_sqlite(root / "database" / "concert_singer" / "concert_singer.sqlite", CONCERT_SINGER)
    write_json(root / "tables.json", [{"db_id": "concert_singer", "table_names_original": []}])
    write_json(root / "train_spider.json", _spider_records(TRAIN_GOLDS))
    write_json(root / "dev.json", _spider_records(DEV_GOLDS))
    return root


@pytest.fixture
def loaded(spider_root: Path, tmp_path: Path) -> tuple[Text2SqlDataset, LoadReport]:
    return load_spider(spider_root, cache_dir=tmp_path / "cache")


def _sorted_rows(rows: Sequence[Sequence[object]]) -> list[tuple[object, ...]]:
    """Rows in a fixed order, floats rounded so that the engines' last bits do not matter."""
    rounded = [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in rows]
    return sorted(rounded, key=repr)


def test_every_kept_gold_returns_the_rows_sqlite_returns(
    loaded: tuple[Text2SqlDataset, LoadReport], spider_root: Path
) -> None:
    dataset, _ = loaded
    sqlite_path = spider_root / "database" / "concert_singer" / "concert_singer.sqlite"
    originals = {f"spider-train-{i}": sql for i, (_, sql) in enumerate(TRAIN_GOLDS)}
    originals |= {f"spider-dev-{i}": sql for i, (_, sql) in enumerate(DEV_GOLDS)}
    database = dataset.database("concert_singer")
    with (
        closing(sqlite3.connect(sqlite_path)) as lite,
        closing(duckdb.connect(str(database.path), read_only=True, config=DUCKDB_CONFIG)) as duck,
    ):
        for example in dataset.split("train") + dataset.split("dev"):
            expected = _sorted_rows(lite.execute(originals[example.id]).fetchall())
            actual = _sorted_rows(duck.execute(example.gold_sql).fetchall())
            assert actual == expected, f"{example.id}: {example.gold_sql}"


def test_gold_that_duckdb_cannot_run_is_reported_not_kept(loaded: tuple[Text2SqlDataset, LoadReport]) -> None:
    dataset, report = loaded
    assert [f.example_id for f in report.failures] == [BROKEN_ID]
    failure = report.failures[0]
    assert failure.category == "duckdb CatalogException"
    assert "julianday" in failure.message
    assert BROKEN_ID not in {e.id for e in dataset.split("dev")}
    assert report.counts == {"train": len(TRAIN_GOLDS), "dev": len(DEV_GOLDS) - 1}
    assert any("duckdb CatalogException" in note and BROKEN_ID in note for note in dataset.notes)


def test_each_repair_is_counted(loaded: tuple[Text2SqlDataset, LoadReport]) -> None:
    _, report = loaded
    for repair in (
        REPAIR_DOUBLE_QUOTED_STRING,
        REPAIR_TEXT_COMPARISON,
        REPAIR_CASE_INSENSITIVE_LIKE,
        REPAIR_INTEGER_DIVISION,
        REPAIR_BARE_COLUMN,
    ):
        assert report.repairs.get(repair, 0) >= 1, repair


def test_gold_sql_keeps_real_quoted_columns_and_turns_unknown_ones_into_strings(
    loaded: tuple[Text2SqlDataset, LoadReport],
) -> None:
    dataset, _ = loaded
    gold = {e.id: e.gold_sql for e in dataset.split("train")}
    assert "'France'" in gold["spider-train-1"]
    assert '"Net Worth"' in gold["spider-train-11"]


def test_ids_splits_and_difficulty(loaded: tuple[Text2SqlDataset, LoadReport]) -> None:
    dataset, _ = loaded
    assert dataset.name == "spider"
    assert [e.id for e in dataset.split("train")] == [f"spider-train-{i}" for i in range(len(TRAIN_GOLDS))]
    assert dataset.split("train")[0].difficulty == "easy"
    assert dataset.split("train")[0].evidence is None


def test_dirty_numeric_columns_become_text_or_lose_their_blanks(
    loaded: tuple[Text2SqlDataset, LoadReport],
) -> None:
    dataset, report = loaded
    assert report.text_columns == ("concert_singer.concert.Rating",)
    assert report.blank_as_null_columns == ("concert_singer.concert.Points",)
    path = dataset.database("concert_singer").path
    with closing(duckdb.connect(str(path), read_only=True, config=DUCKDB_CONFIG)) as con:
        types = dict(
            con.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'concert'"
            ).fetchall()
        )
        rows = con.execute('SELECT "Points", "Rating" FROM concert ORDER BY "Concert ID"').fetchall()
    assert types == {
        "Concert ID": "BIGINT",
        "concert_Name": "VARCHAR",
        "Year": "VARCHAR",
        "Points": "BIGINT",
        "Rating": "VARCHAR",
    }
    assert rows == [(7, "5"), (None, "N/A"), (10, "3")]


def test_a_column_declared_nocase_compares_and_groups_ignoring_case_as_in_sqlite(tmp_path: Path) -> None:
    root = tmp_path / "spider"
    sqlite_path = write_sqlite(
        root / "database" / "pets" / "pets.sqlite",
        """
        CREATE TABLE "Pet" ("id" INTEGER, "Name" TEXT COLLATE NOCASE, city varchar(20) collate nocase, "Code" TEXT);
        INSERT INTO "Pet" VALUES (1, 'Rex', 'Paris', 'AB'), (2, 'rex', 'paris', 'ab'), (3, 'Tom', 'Rome', 'AB');
        """,
    )
    golds = [
        ("How many pets are called rex?", "SELECT count(*) FROM Pet WHERE Name = 'REX'"),
        ("Which cities have more than one pet?", "SELECT city FROM Pet GROUP BY city HAVING count(*) > 1"),
        ("How many pets have code ab?", "SELECT count(*) FROM Pet WHERE Code = 'ab'"),
        ("How many distinct names?", "SELECT count(DISTINCT Name) FROM Pet"),
    ]
    write_json(root / "tables.json", [{"db_id": "pets"}])
    write_json(root / "dev.json", [{"db_id": "pets", "question": q, "query": sql} for q, sql in golds])
    dataset, report = load_spider(root, cache_dir=tmp_path / "cache")
    assert report.failures == ()
    with (
        closing(sqlite3.connect(sqlite_path)) as lite,
        closing(duckdb.connect(str(dataset.database("pets").path), read_only=True, config=DUCKDB_CONFIG)) as duck,
    ):
        answers = [duck.execute(e.gold_sql).fetchall() for e in dataset.split("dev")]
        assert answers == [lite.execute(sql).fetchall() for _, sql in golds]
        # A model's answer in the question's case finds the row, as SQLite would; an undeclared column stays exact.
        assert duck.execute("SELECT id FROM Pet WHERE city = 'ROME'").fetchall() == [(3,)]
        assert duck.execute("SELECT count(*) FROM Pet WHERE Code = 'Ab'").fetchall() == [(0,)]
    assert answers == [[(2,)], [("Paris",)], [(1,)], [(2,)]]


def test_declared_keys_reach_the_prompt_without_being_enforced(tmp_path: Path) -> None:
    root = tmp_path / "spider"
    write_sqlite(
        root / "database" / "school" / "school.sqlite",
        """
        CREATE TABLE dept (code TEXT, name TEXT, PRIMARY KEY (code));
        CREATE TABLE "Student" ("StuID" INTEGER PRIMARY KEY, dept_code TEXT, advisor INTEGER, club TEXT,
            FOREIGN KEY (dept_code) REFERENCES dept(code), FOREIGN KEY (advisor) REFERENCES "Student",
            FOREIGN KEY (club) REFERENCES dept(name));
        INSERT INTO dept VALUES ('CS', 'Computing');
        -- A dangling department and a club naming a column that is no key: SQLite does not enforce them by default.
        INSERT INTO "Student" VALUES (1, 'CS', NULL, 'Chess'), (2, 'XX', 1, 'Go');
        """,
    )
    write_json(root / "tables.json", [{"db_id": "school"}])
    count = {"db_id": "school", "question": "How many students?", "query": "SELECT count(*) FROM Student"}
    write_json(root / "dev.json", [count])
    dataset, report = load_spider(root, cache_dir=tmp_path / "cache")
    assert report.failures == ()
    ddl = dict(schema_ddl(dataset.database("school").path))
    assert ddl["dept"].endswith("  PRIMARY KEY (code)\n);")
    assert ddl["Student"].endswith(
        '  PRIMARY KEY ("StuID"),\n'
        "  FOREIGN KEY (dept_code) REFERENCES dept(code),\n"
        '  FOREIGN KEY (advisor) REFERENCES "Student"("StuID"),\n'
        "  FOREIGN KEY (club) REFERENCES dept(name)\n);"
    )
    with closing(duckdb.connect(str(dataset.database("school").path), read_only=True, config=DUCKDB_CONFIG)) as con:
        assert con.execute('SELECT count(*) FROM "Student"').fetchone() == (2,)


def test_second_load_reuses_the_cached_duckdb_file(spider_root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, _ = load_spider(spider_root, cache_dir=cache)
    built = first.database("concert_singer").path.stat().st_mtime_ns
    second, _ = load_spider(spider_root, cache_dir=cache)
    assert second.database("concert_singer").path.stat().st_mtime_ns == built


def test_second_load_does_not_rerun_gold_queries(
    spider_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    _, first = load_spider(spider_root, cache_dir=cache)

    def run_again(*_: object) -> None:
        raise AssertionError("a gold query ran again")

    monkeypatch.setattr(gold_checks, "_execute_with_timeout", run_again)
    _, second = load_spider(spider_root, cache_dir=cache)
    assert (second.counts, second.failures) == (first.counts, first.failures)


def test_changed_sqlite_file_is_converted_again(spider_root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, _ = load_spider(spider_root, cache_dir=cache)
    built = first.database("concert_singer").path.stat().st_mtime_ns
    sqlite_path = spider_root / "database" / "concert_singer" / "concert_singer.sqlite"
    with closing(sqlite3.connect(sqlite_path)) as con:
        con.execute("INSERT INTO singer VALUES (6, 'Fay', 'France', 20, 1.0)")
        con.commit()
    os.utime(sqlite_path, ns=(built + 10**9, built + 10**9))
    second, _ = load_spider(spider_root, cache_dir=cache)
    path = second.database("concert_singer").path
    assert path.stat().st_mtime_ns != built
    with closing(duckdb.connect(str(path), read_only=True, config=DUCKDB_CONFIG)) as con:
        assert con.execute("SELECT count(*) FROM singer").fetchone() == (6,)


def test_slow_gold_is_reported_as_timeout(spider_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000000) SELECT count(*) FROM c"
    write_json(spider_root / "dev.json", _spider_records([("Count forever", slow)]))
    monkeypatch.setattr(gold_checks, "GOLD_TIMEOUT_S", 0.2)
    _, report = load_spider(spider_root, cache_dir=tmp_path / "cache")
    assert [(f.example_id, f.category) for f in report.failures] == [("spider-dev-0", "timeout")]


def test_missing_tables_json_is_named(spider_root: Path, tmp_path: Path) -> None:
    (spider_root / "tables.json").unlink()
    with pytest.raises(DatasetError, match=r"tables\.json: missing"):
        load_spider(spider_root, cache_dir=tmp_path / "cache")


def test_db_id_without_database_file_is_named(spider_root: Path, tmp_path: Path) -> None:
    write_json(spider_root / "tables.json", [{"db_id": "concert_singer"}, {"db_id": "pets_1"}])
    write_json(spider_root / "dev.json", [{"db_id": "pets_1", "question": "?", "query": "SELECT 1"}])
    with pytest.raises(DatasetError, match=r"dev\.json: db_id 'pets_1' has no database file .*pets_1\.sqlite"):
        load_spider(spider_root, cache_dir=tmp_path / "cache")


def test_db_id_missing_from_tables_json_is_named(spider_root: Path, tmp_path: Path) -> None:
    write_json(spider_root / "dev.json", [{"db_id": "pets_1", "question": "?", "query": "SELECT 1"}])
    with pytest.raises(DatasetError, match=r"dev\.json: db_id 'pets_1' is not described"):
        load_spider(spider_root, cache_dir=tmp_path / "cache")


def test_bad_json_is_named(spider_root: Path, tmp_path: Path) -> None:
    (spider_root / "dev.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"dev\.json: not readable JSON"):
        load_spider(spider_root, cache_dir=tmp_path / "cache")


def test_entry_without_query_is_named(spider_root: Path, tmp_path: Path) -> None:
    write_json(spider_root / "dev.json", [{"db_id": "concert_singer", "question": "?"}])
    with pytest.raises(DatasetError, match=r"dev\.json: entry 0 is malformed"):
        load_spider(spider_root, cache_dir=tmp_path / "cache")


def test_folder_without_split_files_is_refused(tmp_path: Path) -> None:
    write_json(tmp_path / "empty" / "tables.json", [])
    with pytest.raises(DatasetError, match="no Spider split file"):
        load_spider(tmp_path / "empty", cache_dir=tmp_path / "cache")


# ---------------------------------------------------------------------------------------------------
# BIRD

BIRD_DEV = [
    {
        "question_id": 7,
        "db_id": "concert_singer",
        "question": "How many French singers are there?",
        "evidence": "French refers to Country = 'France'",
        "SQL": "SELECT COUNT(*) FROM singer WHERE Country = 'France'",
        "difficulty": "simple",
    },
    {
        "question_id": 9,
        "db_id": "concert_singer",
        "question": "What percentage of concerts were in 2014?",
        "evidence": "percentage = DIVIDE(COUNT(Year = '2014'), COUNT(*)) * 100",
        "SQL": "SELECT SUM(IIF(Year = '2014', 1, 0)) * 100 / COUNT(*) FROM concert",
        "difficulty": "moderate",
    },
]


def _write_bird_split(folder: Path, split: str, records: list[dict[str, object]]) -> None:
    write_sqlite(folder / f"{split}_databases" / "concert_singer" / "concert_singer.sqlite", CONCERT_SINGER)
    write_json(folder / f"{split}_tables.json", [{"db_id": "concert_singer"}])
    write_json(folder / f"{split}.json", records)


def test_bird_keeps_evidence_ids_and_its_own_difficulty(tmp_path: Path) -> None:
    root = tmp_path / "bird"
    _write_bird_split(root / "dev", "dev", BIRD_DEV)
    dataset, report = load_bird(root, cache_dir=tmp_path / "cache")
    examples = dataset.split("dev")
    assert [e.id for e in examples] == ["bird-dev-7", "bird-dev-9"]
    assert examples[0].evidence == "French refers to Country = 'France'"
    assert report.source_difficulty == {"bird-dev-7": "simple", "bird-dev-9": "moderate"}
    assert report.failures == ()


def test_bird_integer_percentage_truncates_like_sqlite(tmp_path: Path) -> None:
    root = tmp_path / "bird"
    _write_bird_split(root / "dev", "dev", BIRD_DEV)
    dataset, _ = load_bird(root, cache_dir=tmp_path / "cache")
    gold = dataset.split("dev")[1].gold_sql
    with closing(duckdb.connect(str(dataset.database("concert_singer").path), config=DUCKDB_CONFIG)) as con:
        assert con.execute(gold).fetchall() == [(66,)]


def test_bird_flat_folder_and_train_without_question_ids(tmp_path: Path) -> None:
    root = tmp_path / "bird"
    _write_bird_split(root, "dev", BIRD_DEV)
    train = [{key: value for key, value in r.items() if key not in ("question_id", "difficulty")} for r in BIRD_DEV]
    _write_bird_split(root / "train", "train", train)
    dataset, _ = load_bird(root, cache_dir=tmp_path / "cache")
    assert [e.id for e in dataset.split("train")] == ["bird-train-0", "bird-train-1"]
    assert [e.id for e in dataset.split("dev")] == ["bird-dev-7", "bird-dev-9"]


def test_bird_missing_tables_file_is_named(tmp_path: Path) -> None:
    root = tmp_path / "bird"
    _write_bird_split(root / "dev", "dev", BIRD_DEV)
    (root / "dev" / "dev_tables.json").unlink()
    with pytest.raises(DatasetError, match=r"dev_tables\.json: missing"):
        load_bird(root, cache_dir=tmp_path / "cache")

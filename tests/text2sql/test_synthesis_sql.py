"""SQL first: the grammar covers every feature over real generated databases, every kept query runs to a
non-trivial answer, and each filter rejects what it is meant to (shown on a small DuckDB file made here)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from tasks.text2sql.dataset import Database
from tasks.text2sql.sources.synthesis.build import SEED
from tasks.text2sql.sources.synthesis.checks import MAX_ROWS, Rejection, judge
from tasks.text2sql.sources.synthesis.databases import ensure_synth_databases
from tasks.text2sql.sources.synthesis.features import Feature, sql_features
from tasks.text2sql.sources.synthesis.questions import evidence_for
from tasks.text2sql.sources.synthesis.sampling import SampledQuery, SamplingStats, sample_queries
from tasks.text2sql.sources.synthesis.schemas import SynthDatabase, synth_databases
from tasks.text2sql.sql.sandbox import SandboxLimits, SqlSandbox

# Databases with a self-reference (banking's referrals, manufacturing's mentors) and opaque columns among them.
DB_IDS = ("veterinary_1", "university_1", "banking_1", "manufacturing_1", "helpdesk_2", "zoo_3")
PER_DATABASE = 40


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SqlSandbox]:
    with SqlSandbox(SandboxLimits(timeout_s=5.0)) as shared:
        yield shared


@pytest.fixture(scope="module")
def generated() -> tuple[dict[str, SynthDatabase], dict[str, Database]]:
    databases = {d.db_id: d for d in synth_databases(SEED) if d.db_id in DB_IDS}
    return databases, ensure_synth_databases(SEED, DB_IDS, show_progress=False)


@pytest.fixture(scope="module")
def sampled(generated, sandbox: SqlSandbox) -> tuple[list[SampledQuery], SamplingStats]:
    databases, files = generated
    stats = SamplingStats()
    queries = [
        q
        for db_id in DB_IDS
        for q in sample_queries(databases[db_id], files[db_id], SEED, PER_DATABASE, sandbox, stats)
    ]
    return queries, stats


@pytest.mark.slow
def test_the_grammar_covers_every_feature(sampled) -> None:
    queries, _ = sampled
    counts = Counter(f for q in queries for f in q.features)
    missing = [f.value for f in Feature if f is not Feature.PLAIN and counts[f] == 0]
    assert not missing, counts
    assert len(queries) >= 0.9 * PER_DATABASE * len(DB_IDS)
    assert len({q.difficulty for q in queries}) == 4


@pytest.mark.slow
def test_every_kept_query_runs_to_a_non_trivial_answer(sampled, generated, sandbox: SqlSandbox) -> None:
    queries, _ = sampled
    _, files = generated
    for query in queries:
        result = sandbox.execute(files[query.db_id].path, query.sql)
        assert result.ok and 1 <= len(result.rows) <= MAX_ROWS, query.sql
        assert any(cell is not None for row in result.rows for cell in row), query.sql
        assert judge(query.sql, files[query.db_id].path, sandbox).kept, query.sql


@pytest.mark.slow
def test_sampling_is_the_same_for_the_same_seed(sampled, generated, sandbox: SqlSandbox) -> None:
    queries, _ = sampled
    databases, files = generated
    again = sample_queries(databases["banking_1"], files["banking_1"], SEED, PER_DATABASE, sandbox, SamplingStats())
    assert [q.sql for q in again] == [q.sql for q in queries if q.db_id == "banking_1"]


@pytest.mark.slow
def test_queries_on_opaque_columns_carry_a_hint(sampled, generated) -> None:
    queries, _ = sampled
    databases, _ = generated
    hinted = [(q, evidence_for(databases[q.db_id], q.sql)) for q in queries if databases[q.db_id].opaque]
    with_hint = [(q, hint) for q, hint in hinted if hint]
    assert with_hint
    for query, hint in with_hint:
        opaque_names = {column for _, column in databases[query.db_id].opaque}
        assert any(name in query.sql for name in opaque_names)
        assert " is the " in hint


# ----- the filters, one by one, on a table whose contents the test chose -----------------------------------------


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("checks") / "shop.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, name VARCHAR, city VARCHAR, vip BOOLEAN)")
        con.execute(
            "INSERT INTO customer VALUES (1, 'Ann', 'Oslo', true), (2, 'Bob', 'Oslo', false), "
            "(3, 'Cy', 'Rome', false), (4, 'Di', 'Rome', NULL), (5, 'Ed', 'Lima', false)"
        )
        con.execute(
            "CREATE TABLE purchase (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(id), "
            "amount INTEGER, note VARCHAR)"
        )
        con.execute("INSERT INTO purchase SELECT i, 1 + i % 4, i * 10 + (i % 3), NULL FROM range(1, 301) AS t(i)")
    return path


CASES = {
    "SELECT name FROM customer WHERE city = 'Paris'": Rejection.EMPTY,
    "SELECT id FROM purchase WHERE amount > 5": Rejection.TOO_MANY_ROWS,
    "SELECT note FROM purchase WHERE id < 4": Rejection.ALL_NULL,
    "SELECT COUNT(*) FROM customer WHERE city = 'Paris'": Rejection.NOTHING_COUNTED,
    "SELECT name, city FROM customer": Rejection.WHOLE_TABLE,
    "SELECT name FROM customer WHERE name = 'Ann'": Rejection.ANSWER_IN_QUESTION,
    "SELECT name FROM customer WHERE city = 'Oslo' AND id < 100": Rejection.IDLE_CONDITION,
    "SELECT name FROM customer WHERE (city = 'Oslo' OR name = 'Ann')": Rejection.IDLE_CONDITION,
    "SELECT T1.name FROM customer AS T1 JOIN customer AS T2 ON T1.id = T2.id WHERE T1.city = 'Rome'": (
        Rejection.IDLE_JOIN
    ),
    "SELECT name FROM customer WHERE city = 'Oslo' UNION SELECT name FROM customer WHERE name = 'Ann'": (
        Rejection.IDLE_OPERAND
    ),
    "SELECT name FROM customer WHERE city <> 'Lima' ORDER BY city LIMIT 1": Rejection.TIE,
    "SELECT city, COUNT(*) FROM customer GROUP BY city ORDER BY COUNT(*) DESC LIMIT 1": Rejection.TIE,
    "SELECT name FROM customer WHERE city = 'Rome' ORDER BY name LIMIT 5": Rejection.IDLE_LIMIT,
}


@pytest.mark.parametrize(("sql", "rejection"), CASES.items(), ids=[r.value for r in CASES.values()])
def test_each_filter_rejects_what_it_is_for(shop: Path, sandbox: SqlSandbox, sql: str, rejection: Rejection) -> None:
    assert judge(sql, shop, sandbox).rejection is rejection


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT name FROM customer WHERE city = 'Oslo'",
        "SELECT T1.name, SUM(T2.amount) FROM customer AS T1 JOIN purchase AS T2 ON T2.customer_id = T1.id "
        "GROUP BY T1.id, T1.name ORDER BY SUM(T2.amount) DESC LIMIT 2",
        "SELECT name FROM customer WHERE id NOT IN (SELECT customer_id FROM purchase)",
        "SELECT name FROM customer WHERE city = 'Oslo' EXCEPT SELECT name FROM customer WHERE vip = true",
        "SELECT COUNT(*) FROM purchase WHERE amount > 1000",
    ],
)
def test_non_trivial_queries_free_of_ties_are_kept(shop: Path, sandbox: SqlSandbox, sql: str) -> None:
    judgement = judge(sql, shop, sandbox)
    assert judgement.kept, judgement


FEATURES = {
    "SELECT a.x FROM t AS a JOIN u AS b ON a.id = b.t_id": {Feature.JOIN},
    "SELECT a.x FROM t AS a JOIN t AS b ON a.m = b.id": {Feature.JOIN, Feature.SELF_JOIN},
    "SELECT c, COUNT(*) FROM t GROUP BY c HAVING COUNT(*) > 2": {Feature.GROUP_BY, Feature.HAVING, Feature.AGGREGATE},
    "SELECT x FROM t WHERE id IN (SELECT t_id FROM u)": {Feature.IN_SUBQUERY},
    "SELECT x FROM t WHERE id NOT IN (SELECT t_id FROM u)": {Feature.NOT_IN_SUBQUERY},
    "SELECT x FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.t_id = t.id)": {Feature.EXISTS},
    "SELECT x FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.t_id = t.id)": {Feature.NOT_EXISTS},
    "SELECT x FROM t WHERE y > (SELECT AVG(y) FROM t)": {Feature.SCALAR_SUBQUERY, Feature.AGGREGATE},
    "SELECT x FROM t UNION SELECT x FROM u": {Feature.SET_OPERATION},
    "SELECT x FROM t ORDER BY y DESC LIMIT 3": {Feature.ORDER_LIMIT},
    "SELECT CASE WHEN y > 1 THEN 'a' ELSE 'b' END FROM t": {Feature.CASE},
    "SELECT x FROM t WHERE date_diff('day', d1, d2) > 3": {Feature.DATE_ARITHMETIC},
    "SELECT x FROM t WHERE d > DATE '2020-01-01' - INTERVAL 30 DAY": {Feature.DATE_ARITHMETIC},
    "SELECT x FROM t WHERE y = 1": {Feature.PLAIN},
}


@pytest.mark.parametrize(("sql", "features"), FEATURES.items())
def test_features_are_read_from_the_syntax(sql: str, features: set[Feature]) -> None:
    assert sql_features(sql) == features

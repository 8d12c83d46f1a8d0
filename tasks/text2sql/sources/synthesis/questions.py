"""What the question-writing LLM is asked, and how its answers are read.

The writer sees the tables the query reads, what their columns mean, the SQL, and a style to write in (drawn per
query from the seed, so the same query always gets the same request). The round trip asks the same LLM for SQL
with the task's own prompt: the schema, the question, and a hint for opaque columns, as BIRD's evidence is.
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.scope import traverse_scope

from tasks.text2sql.sources.domains.schema import Role, Table
from tasks.text2sql.sources.generation.rows import create_table_sql
from tasks.text2sql.sources.seeding import derived_rng
from tasks.text2sql.sources.synthesis.schemas import SynthDatabase

# Bump when a prompt changes: it is part of every cache key, so old answers are not reused for a new prompt.
PROMPT_VERSION = 3

STYLES = (
    "as a short, direct question",
    "as a request that starts with 'List', 'Show', 'Give me' or 'Find'",
    "the way a manager would ask a colleague for it",
    "in a casual, conversational tone",
    "as a precise question in formal English",
    "as a question that starts with 'Which', 'What', 'How many' or 'Who', whichever fits",
    "in at most fifteen words",
    "as a question from someone who does not know how the data is stored",
)

WRITER_SYSTEM = (
    "You turn SQL queries into the questions people ask about their data. Reply with the question only: one "
    "sentence, no SQL, no explanation."
)


def tables_read(database: SynthDatabase, sql: str) -> list[Table]:
    """The database's tables that a query reads, in the schema's order."""
    tree = sqlglot.parse_one(sql, read="duckdb")
    names = {t.name.lower() for t in tree.find_all(exp.Table)}
    return [t for t in database.schema.tables if t.name.lower() in names]


def opaque_columns_used(database: SynthDatabase, sql: str) -> list[tuple[Table, str]]:
    """(table, column) of each opaque column the query mentions, resolved through its aliases scope by scope."""
    if not database.opaque:
        return []
    tables = {t.name.lower(): t for t in database.schema.tables}
    found: list[tuple[Table, str]] = []
    for scope in traverse_scope(sqlglot.parse_one(sql, read="duckdb")):
        sources = {
            alias.lower(): tables[source.name.lower()]
            for alias, source in scope.sources.items()
            if isinstance(source, exp.Table) and source.name.lower() in tables
        }
        for column in scope.columns:
            candidates = [sources[column.table.lower()]] if column.table.lower() in sources else list(sources.values())
            for table in candidates:
                key = (table.name, column.name)
                if key in database.opaque and (table, column.name) not in found:
                    found.append((table, column.name))
    return found


def evidence_for(database: SynthDatabase, sql: str) -> str | None:
    """A hint naming what the opaque columns a query uses hold, or None when it uses none."""
    hints = []
    for table, name in opaque_columns_used(database, sql):
        column = next(c for c in table.columns if c.name == name)
        hints.append(f"{name} in {table.name} is {database.meaning(table, column)}")
    return "; ".join(hints) + "." if hints else None


# Solved requests shown before the real one, over a small schema of their own: a model of 0.5B parameters follows
# examples much better than instructions. They come first, so every request shares them as a prefix.
_EXAMPLE_TABLES = (
    "CREATE TABLE shops (\n  id INTEGER PRIMARY KEY,\n  name VARCHAR,\n  city VARCHAR\n);\n"
    "CREATE TABLE cakes (\n  id INTEGER PRIMARY KEY,\n  shop_id INTEGER,\n  flavor VARCHAR,\n  price DECIMAL(6,2),\n"
    "  baked_on DATE,\n  FOREIGN KEY (shop_id) REFERENCES shops(id)\n);"
)
_EXAMPLE_MEANINGS = (
    "- shops.name: the shop's name\n- shops.city: the shop's city\n- cakes.flavor: the cake's flavor\n"
    "- cakes.price: the cake's price\n- cakes.baked_on: the cake's baking date"
)
_EXAMPLES = (
    (
        "SELECT DISTINCT T1.name FROM shops AS T1 JOIN cakes AS T2 ON T2.shop_id = T1.id "
        "WHERE T2.flavor = 'lemon' AND T2.price > 20",
        STYLES[0],
        "Which shops sell a lemon cake that costs more than 20?",
    ),
    (
        "SELECT city, COUNT(*) FROM shops GROUP BY city HAVING COUNT(*) > 2",
        STYLES[2],
        "For every city with more than two shops, how many shops are there?",
    ),
    (
        "SELECT name FROM shops WHERE id NOT IN (SELECT shop_id FROM cakes WHERE EXTRACT(YEAR FROM baked_on) = 2023)",
        STYLES[1],
        "List the shops that baked no cakes in 2023.",
    ),
    (
        "SELECT flavor, price FROM cakes ORDER BY price DESC LIMIT 3",
        STYLES[5],
        "What are the flavors and prices of the three most expensive cakes?",
    ),
)


def _request(description: str, ddl: str, meanings: str, sql: str, style: str) -> str:
    return (
        f"Database: {description}\n\nTables:\n{ddl}\n\nWhat the columns hold:\n{meanings}\n\nSQL:\n{sql}\n\n"
        f"Write the question that this SQL query answers, {style}. Use everyday words instead of table and column "
        "names, keep every condition and value of the query in the question, and reply with the question only."
    )


def writer_messages(database: SynthDatabase, sql: str, seed: int) -> list[dict[str, str]]:
    """The chat messages that ask for the question of one query: the solved examples, then the query."""
    messages = [{"role": "system", "content": WRITER_SYSTEM}]
    for example_sql, example_style, question in _EXAMPLES:
        request = _request("A bakery chain.", _EXAMPLE_TABLES, _EXAMPLE_MEANINGS, example_sql, example_style)
        messages += [{"role": "user", "content": request}, {"role": "assistant", "content": question}]
    used = tables_read(database, sql)
    ddl = "\n".join(create_table_sql(database.schema, t) + ";" for t in used)
    meanings = "\n".join(
        f"- {t.name}.{c.name}: {database.meaning(t, c)}"
        for t in used
        for c in t.columns
        if c.role not in (Role.ID, Role.FOREIGN_KEY)
    )
    style = derived_rng(seed, "style", database.db_id, sql).choice(STYLES)
    messages.append({"role": "user", "content": _request(database.description, ddl, meanings, sql, style)})
    return messages


_SQL_IN_TEXT = re.compile(r"\bSELECT\b.*\bFROM\b", re.IGNORECASE | re.DOTALL)
_PREFIX = re.compile(r"^(?:\*\*)?(?:question|q|rewritten question|natural language question)\s*[:\-]\s*", re.IGNORECASE)
MIN_WORDS, MAX_WORDS = 3, 60


def parse_question(text: str) -> str | None:
    """The question in a writer's reply, or None when the reply holds no usable question (empty, SQL, rambling)."""
    lines = [line.strip() for line in text.replace("```", "\n").splitlines() if line.strip()]
    if not lines:
        return None
    question = _PREFIX.sub("", lines[0]).strip().strip("*").strip().strip("\"'`").strip()
    if _SQL_IN_TEXT.search(question) or not MIN_WORDS <= len(question.split()) <= MAX_WORDS:
        return None
    if not re.search(r"[A-Za-z]{3}", question):
        return None
    return question

"""Screening of untrusted SQL before it runs: the checks `SqlSandbox` (sandbox.py) makes on the text alone.

1. Size: text longer than the limit is refused without being parsed.
2. Shape: DuckDB's own parser must find exactly one statement, of type SELECT (which covers WITH,
   UNION/INTERSECT/EXCEPT, VALUES, FROM-first, DESCRIBE, SHOW and SUMMARIZE). The statement the parser
   returned is what runs, so no text the check did not see can reach the engine.
3. Names: DuckDB's own tokenizer lists every function call; calls that reach outside the database, run
   SQL held in a string, change state, sleep, or build one value of unbounded size are refused.
"""

from __future__ import annotations

import duckdb

# Function names are compared lowercased, after unquoting ("read_csv" and READ_CSV are the same call).
#
# Readers of files, URLs and Python objects. External access is off, so DuckDB refuses the file readers
# anyway; refusing them by name keeps that true should a setting ever slip. The *_scan family includes
# arrow_scan and pandas_scan, which take raw memory addresses and could crash the process.
_READER_PREFIXES = ("read_", "parquet_", "sniff_")
_READER_SUFFIXES = ("_scan",)
_READERS = frozenset({"glob", "arrow_scan_dumb", "python_map_function"})
# Run SQL given as a string, which every check here would see only as a literal.
_SQL_RUNNERS = frozenset({"query", "query_table", "json_execute_serialized_sql"})
# Change the database, the connection or the process: checkpoints, sequences, the random seed (which
# would make later queries on the cached connection depend on this one), logging, profiling, the grammar.
_STATE_CHANGERS = frozenset(
    {
        "checkpoint",
        "force_checkpoint",
        "set_config",
        "setseed",
        "setval",
        "nextval",
        "write_log",
        "enable_logging",
        "disable_logging",
        "truncate_duckdb_logs",
        "enable_profiling",
        "disable_profiling",
        "add_grammar_extension",
        "remove_grammar_extension",
        "create_external_resource",
        "destroy_external_resource",
        "register_external_resource",
        "register_external_resource_type",
        "deregister_external_resource",
    }
)
# Reveal what is not this database: credentials, the environment, the extension directory on disk, and
# logs, metrics or prepared statements that could hold other connections' SQL, such as the gold query of
# the same example. Refused wherever the name stands, since duckdb_logs is also a view. Catalog and
# settings introspection (duckdb_tables(), information_schema, duckdb_settings()) stays allowed: it is
# read-only, the configuration is locked, and a policy may legitimately look up the schema.
_OUTSIDE_INTROSPECTION = frozenset(
    {
        "getenv",
        "duckdb_secrets",
        "which_secret",
        "duckdb_extensions",
        "duckdb_temporary_files",
        "duckdb_logs",
        "duckdb_logs_parsed",
        "duckdb_log_contexts",
        "duckdb_live_query_metrics",
        "duckdb_prepared_statements",
    }
)
# A sleep cannot be interrupted, so it would hold the calling thread past any time limit.
_SLEEPERS = frozenset({"sleep_ms", "pg_sleep"})
# Build one value whose size is an argument (repeat('x', 1e9), range(1e9) as a list): DuckDB allocates it
# outside memory_limit and cannot interrupt it. The table functions of the same names stream rows and
# notice interrupts, so they stay allowed where only a table can stand: right after FROM, JOIN, LATERAL.
_AMPLIFIERS = frozenset({"repeat", "lpad", "rpad", "list_resize", "array_resize", "range", "generate_series"})
_TABLE_FUNCTION_AMPLIFIERS = frozenset({"repeat", "range", "generate_series"})
_TABLE_POSITION = frozenset({"from", "join", "lateral"})
# Keywords after which a string literal names a table, which DuckDB would read as a file or URL.
_TABLE_NAMING = frozenset({"from", "join", "describe", "summarize", "show", "pivot", "unpivot"})
# Data-changing clauses DuckDB accepts inside a query (WITH x AS (DELETE ... RETURNING *) SELECT ...).
# Read-only mode refuses them at run time; naming them here gives a clearer refusal.
_WRITE_CLAUSES = frozenset({("delete", "from"), ("insert", "into"), ("insert", "or"), ("merge", "into")})
# UPDATE's target may be qualified and aliased (UPDATE main.t AS x SET), so SET is looked for a few
# tokens on rather than next.
_UPDATE_SET_WINDOW = 6


class RefusedSqlError(Exception):
    """A statement screening stopped before it ran. `blocked`: it is not allowed (a forbidden call, statement or
    clause); otherwise it is not SQL DuckDB can parse at all."""

    def __init__(self, message: str, blocked: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.blocked = blocked


def screen(connection: duckdb.DuckDBPyConnection, sql: str, max_sql_chars: int) -> duckdb.Statement:
    """The one read-only query `sql` holds, parsed by `connection`'s DuckDB; raises RefusedSqlError when the text is
    longer than `max_sql_chars` or holds anything else."""
    if len(sql) > max_sql_chars:
        raise RefusedSqlError(f"SQL of {len(sql)} characters exceeds the limit of {max_sql_chars}")
    return _parse_single_query(connection, sql)


def _refusal_of_call(name: str, previous: str) -> str | None:
    """Why a call of `name` after the token `previous` is refused, or None when it is allowed."""
    if name in _READERS or name.startswith(_READER_PREFIXES) or name.endswith(_READER_SUFFIXES):
        return f"{name}() reads files, URLs or memory outside the database"
    if name in _SQL_RUNNERS:
        return f"{name}() runs SQL held in a string"
    if name in _STATE_CHANGERS:
        return f"{name}() changes database, connection or process state"
    if name in _SLEEPERS:
        return f"{name}() sleeps and cannot be interrupted"
    if name in _AMPLIFIERS and not (name in _TABLE_FUNCTION_AMPLIFIERS and previous in _TABLE_POSITION):
        return f"{name}() builds a value of unbounded size outside the memory limit"
    return None


def _screen_tokens(sql: str) -> None:
    """Raise RefusedSqlError for a forbidden call, a file named as a table, or a write clause inside the query."""
    data = sql.encode()
    # DuckDB's tokenizer reports byte offsets; a token runs to the next one, whitespace trimmed.
    starts = duckdb.tokenize(sql)
    tokens: list[tuple[duckdb.token_type, str]] = []
    for index, (start, kind) in enumerate(starts):
        if kind == duckdb.token_type.comment:
            continue
        end = starts[index + 1][0] if index + 1 < len(starts) else len(data)
        tokens.append((kind, data[start:end].decode(errors="replace").strip()))

    words = [_word(kind, text) for kind, text in tokens]
    for index, (kind, text) in enumerate(tokens):
        previous = words[index - 1] if index > 0 else ""
        following = tokens[index + 1][1] if index + 1 < len(tokens) else ""
        word = words[index]
        if word in _OUTSIDE_INTROSPECTION:
            raise RefusedSqlError(f"{word} reveals state outside this database")
        if word and following.startswith("("):
            reason = _refusal_of_call(word, previous)
            if reason is not None:
                raise RefusedSqlError(reason)
        if kind == duckdb.token_type.string_const and previous in _TABLE_NAMING:
            raise RefusedSqlError(f"a string ({text}) names a table, which reads a file or URL")
        if kind == duckdb.token_type.keyword and (
            (word, following.lower()) in _WRITE_CLAUSES
            or (word == "update" and "set" in words[index + 2 : index + _UPDATE_SET_WINDOW])
        ):
            raise RefusedSqlError(f"a data-changing {word.upper()} inside a query")


def is_utf8(text: str) -> bool:
    """Whether `text` encodes as UTF-8, as DuckDB's binding needs; a decoded completion may hold a lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _word(kind: duckdb.token_type, text: str) -> str:
    """The lowercased name a keyword or identifier token stands for; empty for other tokens."""
    if kind == duckdb.token_type.keyword:
        return text.lower()
    if kind == duckdb.token_type.identifier:
        if text.startswith('"') and text.endswith('"') and len(text) >= 2:
            text = text[1:-1].replace('""', '"')
        return text.lower()
    return ""


def _parse_single_query(connection: duckdb.DuckDBPyConnection, sql: str) -> duckdb.Statement:
    """The one read-only query `sql` holds; raises RefusedSqlError when it holds anything else."""
    if not is_utf8(sql):
        raise RefusedSqlError("the SQL is not valid Unicode text (a lone surrogate)", blocked=False)
    try:
        statements = connection.extract_statements(sql)
    except duckdb.Error as error:
        raise RefusedSqlError(str(error), blocked=False) from error
    try:
        kinds = [statement.type for statement in statements]
    except ValueError as error:
        # The Python binding cannot name some statement types (UPDATE EXTENSIONS); none is a query.
        raise RefusedSqlError(f"unsupported statement type: {error}") from error
    if not statements:
        raise RefusedSqlError("no statement: the SQL is empty or only comments")
    if len(statements) > 1:
        names = ", ".join(kind.name for kind in kinds)
        raise RefusedSqlError(f"{len(statements)} statements ({names}); only one query is allowed")
    if kinds[0] is not duckdb.StatementType.SELECT:
        raise RefusedSqlError(f"{kinds[0].name} statements are not allowed; only a single read-only query (SELECT) is")
    _screen_tokens(sql)
    return statements[0]

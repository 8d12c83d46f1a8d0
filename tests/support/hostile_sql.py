"""Hostile and pathological SQL the sandbox must contain, each with the outcomes it may end in.

Written against the fixture database of tests/text2sql/test_sandbox.py and test_sandbox_workers.py: tables
`customers(id, name, city)` and `orders(id, customer_id, amount, placed_on)` in a file named `shop.duckdb`. `$TMP`
stands for a directory the test owns; nothing may appear in it.

ERROR is accepted only where DuckDB itself refuses the statement (its memory limit, its parser, an
unknown name); each such case says so in `why`. A few cases are pathological but harmless and end OK;
`why` says what makes them harmless.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.text2sql.sql.sandbox import ExecutionStatus

BLOCKED = frozenset({ExecutionStatus.BLOCKED})
TIMED_OUT = frozenset({ExecutionStatus.TIMED_OUT})
# A runaway query may run into the clock or, first, into DuckDB's memory limit.
TIMED_OUT_OR_MEMORY = frozenset({ExecutionStatus.TIMED_OUT, ExecutionStatus.ERROR})
MEMORY_LIMIT = "memory limit"
UNKNOWN_NAME = "does not exist"
TOO_DEEP = "expression depth"
DUCKDB_REFUSES = frozenset({ExecutionStatus.ERROR})
HARMLESS = frozenset({ExecutionStatus.OK})


@dataclass(frozen=True)
class HostileCase:
    name: str
    sql: str
    # The statuses the case may end in.
    allowed: frozenset[ExecutionStatus]
    # Why an outcome other than BLOCKED or TIMED_OUT is acceptable.
    why: str = ""
    # Text an ERROR's message must contain, so that an unrelated error cannot pass for the expected one.
    error_hint: str = ""


def _repeated_plus(count: int) -> str:
    return "SELECT " + "1 + " * count + "1"


def _nested_subqueries(depth: int) -> str:
    return "SELECT * FROM " + "(SELECT * FROM " * depth + "customers" + ") AS s" * depth


HOSTILE_CASES: list[HostileCase] = [
    # Reading files, URLs and memory outside the database.
    HostileCase("read_csv_passwd", "SELECT * FROM read_csv('/etc/passwd')", BLOCKED),
    HostileCase("read_csv_auto_passwd", "SELECT * FROM read_csv_auto('/etc/passwd')", BLOCKED),
    HostileCase("read_csv_file_list", "SELECT * FROM read_csv(['/etc/passwd', '/etc/hosts'])", BLOCKED),
    HostileCase("read_text_passwd", "SELECT content FROM read_text('/etc/passwd')", BLOCKED),
    HostileCase("read_blob_shadow", "SELECT content FROM read_blob('/etc/shadow')", BLOCKED),
    HostileCase("glob_root", "SELECT * FROM glob('/*')", BLOCKED),
    HostileCase("glob_own_directory", "SELECT * FROM glob('$TMP/*')", BLOCKED),
    HostileCase("string_as_table", "SELECT * FROM '/etc/passwd'", BLOCKED),
    HostileCase("string_as_joined_table", "SELECT * FROM customers JOIN '/etc/hosts' ON true", BLOCKED),
    HostileCase("string_as_table_from_first", "FROM '/etc/passwd'", BLOCKED),
    HostileCase("describe_string_path", "DESCRIBE '/etc/passwd'", BLOCKED),
    HostileCase("summarize_string_path", "SUMMARIZE '/etc/passwd'", BLOCKED),
    HostileCase(
        "string_as_table_after_comma",
        "SELECT * FROM customers, '/etc/passwd'",
        DUCKDB_REFUSES | BLOCKED,
        "with external access off DuckDB does not turn the string into a file scan: unknown table",
        error_hint=UNKNOWN_NAME,
    ),
    HostileCase(
        "quoted_identifier_as_path",
        'SELECT * FROM "/etc/passwd"',
        DUCKDB_REFUSES | BLOCKED,
        "with external access off DuckDB does not turn the name into a file scan: unknown table",
        error_hint=UNKNOWN_NAME,
    ),
    HostileCase("read_parquet", "SELECT * FROM read_parquet('/tmp/data.parquet')", BLOCKED),
    HostileCase("parquet_scan", "SELECT * FROM parquet_scan('/tmp/data.parquet')", BLOCKED),
    HostileCase("parquet_metadata", "SELECT * FROM parquet_metadata('/tmp/data.parquet')", BLOCKED),
    HostileCase("read_json_auto", "SELECT * FROM read_json_auto('/etc/os-release')", BLOCKED),
    HostileCase("read_ndjson_objects", "SELECT * FROM read_ndjson_objects('/etc/os-release')", BLOCKED),
    HostileCase("sniff_csv", "SELECT * FROM sniff_csv('/etc/passwd')", BLOCKED),
    HostileCase("http_csv", "SELECT * FROM read_csv('https://example.com/data.csv')", BLOCKED),
    HostileCase("http_string_as_table", "SELECT * FROM 'https://example.com/data.parquet'", BLOCKED),
    HostileCase("s3_parquet", "SELECT * FROM read_parquet('s3://bucket/key.parquet')", BLOCKED),
    HostileCase(
        "reader_in_where",
        "SELECT * FROM customers WHERE name IN (SELECT content FROM read_text('/etc/passwd'))",
        BLOCKED,
    ),
    HostileCase(
        "reader_in_union", "SELECT name FROM customers UNION ALL SELECT content FROM read_text('/etc/hosts')", BLOCKED
    ),
    HostileCase("quoted_function_name", "SELECT * FROM \"read_csv\"('/etc/passwd')", BLOCKED),
    HostileCase("qualified_function_name", "SELECT * FROM system.main.read_text('/etc/passwd')", BLOCKED),
    HostileCase("mixed_case_function", "SeLeCt * FrOm ReAd_TeXt('/etc/passwd')", BLOCKED),
    HostileCase("comment_before_parenthesis", "SELECT * FROM read_text/* hide */('/etc/passwd')", BLOCKED),
    HostileCase("arrow_scan_raw_pointer", "SELECT * FROM arrow_scan(1, 2, 3)", BLOCKED),
    HostileCase("pandas_scan_raw_pointer", "SELECT * FROM pandas_scan(1)", BLOCKED),
    HostileCase("getenv", "SELECT getenv('HOME')", BLOCKED),
    HostileCase("secrets", "SELECT * FROM duckdb_secrets()", BLOCKED),
    HostileCase("extensions_directory", "SELECT * FROM duckdb_extensions()", BLOCKED),
    HostileCase("other_connections_logs_view", "SELECT * FROM system.main.duckdb_logs", BLOCKED),
    HostileCase("other_connections_logs_call", "SELECT * FROM duckdb_logs()", BLOCKED),
    # SQL held in a string, which would hide everything above from a check of the text.
    HostileCase("query_string", "SELECT * FROM query('SELECT * FROM read_csv(''/etc/passwd'')')", BLOCKED),
    HostileCase("query_table", "SELECT * FROM query_table('customers')", BLOCKED),
    HostileCase("serialized_sql", "SELECT * FROM json_execute_serialized_sql('{}')", BLOCKED),
    # Writing files.
    HostileCase("copy_table_to_file", "COPY customers TO '$TMP/leak.csv'", BLOCKED),
    HostileCase(
        "copy_query_to_parquet", "COPY (SELECT * FROM orders) TO '$TMP/leak.parquet' (FORMAT parquet)", BLOCKED
    ),
    HostileCase("copy_to_stdout", "COPY (SELECT 1) TO '/dev/stdout'", BLOCKED),
    HostileCase("copy_from_file", "COPY customers FROM '/etc/passwd'", BLOCKED),
    HostileCase("export_database", "EXPORT DATABASE '$TMP/dump'", BLOCKED),
    HostileCase("import_database", "IMPORT DATABASE '$TMP/dump'", BLOCKED),
    # Other databases, extensions, settings.
    HostileCase("attach_file", "ATTACH '$TMP/other.duckdb' AS other", BLOCKED),
    HostileCase("attach_memory", "ATTACH ':memory:' AS scratch", BLOCKED),
    HostileCase("detach", "DETACH shop", BLOCKED),
    HostileCase("use_other_catalog", "USE memory", BLOCKED),
    HostileCase("install_httpfs", "INSTALL httpfs", BLOCKED),
    HostileCase("force_install_community", "FORCE INSTALL shellfs FROM community", BLOCKED),
    HostileCase("load_httpfs", "LOAD httpfs", BLOCKED),
    HostileCase("update_extensions", "UPDATE EXTENSIONS", BLOCKED),
    HostileCase("set_threads", "SET threads = 64", BLOCKED),
    HostileCase("enable_external_access", "SET enable_external_access = true", BLOCKED),
    HostileCase("unlock_configuration", "SET lock_configuration = false", BLOCKED),
    HostileCase("reset_memory_limit", "RESET memory_limit", BLOCKED),
    HostileCase("set_variable", "SET VARIABLE secret = 42", BLOCKED),
    HostileCase("pragma_profiling", "PRAGMA enable_profiling", BLOCKED),
    HostileCase("pragma_threads", "PRAGMA threads = 8", BLOCKED),
    HostileCase("set_config_function", "SELECT set_config('threads', '8', false)", BLOCKED),
    HostileCase("setseed", "SELECT setseed(0.5)", BLOCKED),
    HostileCase("write_log", "SELECT write_log('hello')", BLOCKED),
    HostileCase("enable_logging_call", "CALL enable_logging()", BLOCKED),
    HostileCase("enable_logging_table_function", "SELECT * FROM enable_logging()", BLOCKED),
    HostileCase("nextval", "SELECT nextval('order_ids')", BLOCKED),
    # Changing the database.
    HostileCase("checkpoint", "CHECKPOINT", BLOCKED),
    HostileCase("force_checkpoint_function", "SELECT * FROM force_checkpoint()", BLOCKED),
    HostileCase("vacuum", "VACUUM", BLOCKED),
    HostileCase("analyze", "ANALYZE", BLOCKED),
    HostileCase("call_pragma", "CALL pragma_version()", BLOCKED),
    HostileCase("create_table", "CREATE TABLE loot AS SELECT * FROM customers", BLOCKED),
    HostileCase("create_temp_table", "CREATE TEMP TABLE scratch AS SELECT 1 AS x", BLOCKED),
    HostileCase("create_macro", "CREATE MACRO twice(x) AS x * 2", BLOCKED),
    HostileCase("create_secret", "CREATE SECRET (TYPE s3, KEY_ID 'k', SECRET 's')", BLOCKED),
    HostileCase("insert", "INSERT INTO customers VALUES (9999, 'mallory', 'nowhere')", BLOCKED),
    HostileCase("insert_returning", "INSERT INTO customers VALUES (9999, 'mallory', 'x') RETURNING *", BLOCKED),
    HostileCase("update", "UPDATE orders SET amount = 0", BLOCKED),
    HostileCase("delete", "DELETE FROM orders", BLOCKED),
    HostileCase("truncate", "TRUNCATE orders", BLOCKED),
    HostileCase("drop_table", "DROP TABLE customers", BLOCKED),
    HostileCase("alter_table", "ALTER TABLE customers ADD COLUMN pwned INTEGER", BLOCKED),
    HostileCase(
        "merge_into", "MERGE INTO orders USING customers ON orders.id = customers.id WHEN MATCHED THEN DELETE", BLOCKED
    ),
    HostileCase("delete_in_cte", "WITH gone AS (DELETE FROM orders RETURNING *) SELECT count(*) FROM gone", BLOCKED),
    HostileCase("update_in_cte", "WITH x AS (UPDATE orders SET amount = 0 RETURNING *) SELECT * FROM x", BLOCKED),
    HostileCase("begin_transaction", "BEGIN TRANSACTION", BLOCKED),
    HostileCase("prepare", "PREPARE q AS SELECT 1", BLOCKED),
    HostileCase("explain_analyze", "EXPLAIN ANALYZE SELECT * FROM orders", BLOCKED),
    # More than one statement, however disguised.
    HostileCase("two_statements", "SELECT 1; DROP TABLE customers", BLOCKED),
    HostileCase("semicolon_in_block_comment", "SELECT 1 /* ; */; DELETE FROM orders", BLOCKED),
    HostileCase("line_comment_then_statement", "SELECT 1 -- harmless\n; DROP TABLE orders", BLOCKED),
    HostileCase("semicolon_in_string", "SELECT 'a;b'; DROP TABLE orders", BLOCKED),
    HostileCase("dollar_quoted_semicolon", "SELECT $$ ; $$; DROP TABLE orders", BLOCKED),
    HostileCase("empty_statements_around", ";;; SELECT 1 ;;; DROP TABLE orders ;;;", BLOCKED),
    HostileCase("nul_byte_before_statement", "SELECT 1\x00; DROP TABLE orders", BLOCKED),
    HostileCase("bidi_override_in_comment", "SELECT 1 /*\u202e ; */; DROP TABLE orders", BLOCKED),
    HostileCase("mixed_case_drop", "dRoP tAbLe customers", BLOCKED),
    HostileCase("two_queries", "FROM customers; FROM orders", BLOCKED),
    # Quoting tricks against the name check: each string ends where DuckDB's lexer says it does.
    HostileCase(
        "standard_string_backslash", "SELECT 'a\\', (SELECT count(*) FROM read_text('/etc/passwd')) --'", BLOCKED
    ),
    HostileCase("escape_string_quote", "SELECT E'\\'', (SELECT count(*) FROM read_text('/etc/passwd')) --'", BLOCKED),
    # Nothing to run.
    HostileCase("empty", "", BLOCKED),
    HostileCase("only_comment", "-- nothing here", BLOCKED),
    HostileCase("only_semicolons", " ; ; ", BLOCKED),
    HostileCase("too_long", "SELECT " + "1 + " * 6000 + "1", BLOCKED, "over max_sql_chars, refused unparsed"),
    # Unicode lookalikes do not name the real functions or keywords.
    HostileCase(
        "fullwidth_keyword",
        "SELECT 1; ＤＲＯＰ TABLE orders",
        DUCKDB_REFUSES,
        "DuckDB's parser rejects the fullwidth keyword: a syntax error, nothing runs",
        error_hint="syntax error",
    ),
    HostileCase(
        "zero_width_space_in_name",
        "SELECT * FROM read\u200b_text('/etc/passwd')",
        DUCKDB_REFUSES,
        "a different name: DuckDB knows no such function",
        error_hint=UNKNOWN_NAME,
    ),
    HostileCase(
        "cyrillic_lookalike_name",
        "SELECT * FROM r\u0435ad_text('/etc/passwd')",
        DUCKDB_REFUSES,
        "a different name: DuckDB knows no such function",
        error_hint=UNKNOWN_NAME,
    ),
    # Time and memory.
    HostileCase("sleep", "SELECT sleep_ms(100000)", BLOCKED),
    HostileCase("pg_sleep", "SELECT pg_sleep(100)", BLOCKED),
    HostileCase(
        "infinite_recursive_cte",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
        TIMED_OUT_OR_MEMORY,
        "DuckDB's memory limit may stop it before the clock",
        error_hint=MEMORY_LIMIT,
    ),
    HostileCase(
        "infinite_recursive_cte_distinct",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION SELECT n + 1 FROM r) SELECT max(n) FROM r",
        TIMED_OUT_OR_MEMORY,
        "DuckDB's memory limit may stop it before the clock",
        error_hint=MEMORY_LIMIT,
    ),
    HostileCase(
        "doubling_recursive_cte",
        "WITH RECURSIVE r(s, n) AS (SELECT 'x', 0 UNION ALL SELECT s || s, n + 1 FROM r WHERE n < 40) "
        "SELECT max(length(s)) FROM r",
        TIMED_OUT_OR_MEMORY,
        "DuckDB's memory limit may stop it before the clock",
        error_hint=MEMORY_LIMIT,
    ),
    HostileCase("giant_cross_join", "SELECT count(*) FROM orders a, orders b, orders c, orders d", TIMED_OUT),
    HostileCase("range_aggregation", "SELECT sum(range) FROM range(1000000000000)", TIMED_OUT),
    HostileCase("generate_series_aggregation", "SELECT count(*) FROM generate_series(1, 1000000000000)", TIMED_OUT),
    HostileCase(
        "sort_far_beyond_memory",
        "SELECT count(*) FROM (SELECT * FROM range(1000000000) ORDER BY random())",
        TIMED_OUT_OR_MEMORY,
        "DuckDB's memory limit may stop it before the clock",
        error_hint=MEMORY_LIMIT,
    ),
    HostileCase(
        "huge_string_agg",
        "SELECT length(string_agg(md5(range::VARCHAR), '')) FROM range(1000000000)",
        TIMED_OUT_OR_MEMORY,
        "DuckDB's memory limit may stop it before the clock",
        error_hint=MEMORY_LIMIT,
    ),
    HostileCase(
        "huge_list_aggregate",
        "SELECT len(list(range)) FROM range(1000000000)",
        TIMED_OUT_OR_MEMORY,
        "DuckDB's memory limit may stop it before the clock",
        error_hint=MEMORY_LIMIT,
    ),
    HostileCase("repeat_gigabyte", "SELECT repeat('x', 1000000000)", BLOCKED),
    HostileCase("repeat_method_call", "SELECT 'x'.repeat(1000000000)", BLOCKED),
    HostileCase("repeat_per_row", "SELECT max(length(repeat(name, 100000000))) FROM customers", BLOCKED),
    HostileCase("lpad_gigabyte", "SELECT lpad('x', 1000000000, 'y')", BLOCKED),
    HostileCase("scalar_range_list", "SELECT list_sum(range(1000000000))", BLOCKED),
    HostileCase("list_resize", "SELECT len(list_resize([1], 1000000000))", BLOCKED),
    HostileCase(
        "table_range_beside_comma",
        "SELECT count(*) FROM customers, range(1000000000000)",
        BLOCKED,
        "range() only counts as a table right after FROM/JOIN/LATERAL",
    ),
    HostileCase(
        "deeply_nested_parentheses",
        "SELECT " + "(" * 5000 + "1" + ")" * 5000,
        DUCKDB_REFUSES,
        "DuckDB's parser stops at max_expression_depth",
        error_hint=TOO_DEEP,
    ),
    HostileCase(
        "deep_expression_chain",
        _repeated_plus(4000),
        DUCKDB_REFUSES,
        "DuckDB's parser stops at max_expression_depth",
        error_hint=TOO_DEEP,
    ),
    HostileCase(
        "deeply_nested_subqueries",
        _nested_subqueries(900),
        HARMLESS,
        "the deepest nesting that fits in max_sql_chars binds without exhausting the stack",
    ),
    HostileCase(
        "regex_backtracking",
        "SELECT regexp_matches('" + "a" * 10000 + "!', '^(a+)+$')",
        HARMLESS,
        "RE2 does not backtrack: linear time",
    ),
    # Reading configuration: allowed on purpose, the configuration is locked and holds no secret.
    HostileCase("read_settings", "SELECT * FROM duckdb_settings()", HARMLESS, "read-only; configuration is locked"),
    HostileCase(
        "read_one_setting", "SELECT current_setting('memory_limit')", HARMLESS, "read-only; configuration is locked"
    ),
]

"""Prompts show the schema and question; completions are cut back to one SQL statement."""

from __future__ import annotations

from tasks.text2sql.dataset import Text2SqlDataset
from tasks.text2sql.prompts import parse_completion, render_prompt, schema_ddl, tables_used
from tasks.text2sql.task import Text2SqlTask


def test_plain_statement_with_semicolon_stops_cleanly() -> None:
    parsed = parse_completion(" SELECT name FROM t WHERE x = 1;\n")
    assert parsed.sql == "SELECT name FROM t WHERE x = 1"
    assert parsed.clean_stop


def test_code_fences_are_stripped() -> None:
    parsed = parse_completion("Here you go:\n```sql\nSELECT 1;\n```")
    assert parsed.sql == "SELECT 1"
    assert parsed.clean_stop


def test_text_after_the_fence_is_trailing() -> None:
    parsed = parse_completion("```sql\nSELECT 1;\n```\nThis query selects one.")
    assert parsed.sql == "SELECT 1"
    assert not parsed.clean_stop
    assert "selects one" in parsed.trailing


def test_a_rambling_continuation_is_cut_at_the_first_statement_end() -> None:
    parsed = parse_completion("SELECT a FROM t;\nQuestion: How many?\nSQL: SELECT COUNT(*) FROM t;")
    assert parsed.sql == "SELECT a FROM t"
    assert not parsed.clean_stop


def test_semicolons_inside_strings_and_comments_do_not_end_the_statement() -> None:
    parsed = parse_completion("SELECT 'a;b', \"c;d\" -- not; the end\nFROM t /* ; */ WHERE x = 'it''s;';")
    assert parsed.sql == "SELECT 'a;b', \"c;d\" -- not; the end\nFROM t /* ; */ WHERE x = 'it''s;'"
    assert parsed.clean_stop


def test_without_semicolon_the_next_block_ends_the_query() -> None:
    parsed = parse_completion("SELECT a FROM t\n\nQuestion: next one")
    assert parsed.sql == "SELECT a FROM t"
    assert not parsed.clean_stop
    assert parse_completion("SELECT a FROM t").sql == "SELECT a FROM t"


def test_a_leading_sql_label_is_dropped_and_empty_completions_have_no_sql() -> None:
    assert parse_completion("SQL: SELECT 1;").sql == "SELECT 1"
    empty = parse_completion("   ")
    assert empty.sql == ""
    assert not empty.clean_stop


def test_prompt_shows_schema_question_and_ends_where_the_answer_goes(bundled: Text2SqlDataset) -> None:
    example = bundled.split("dev")[0]
    prompt = render_prompt(example, bundled.database(example.db_id).path)
    assert prompt.endswith("SQL:")
    assert f"Question: {example.question}" in prompt
    for table in ("airlines", "airports", "flights", "bookings"):
        assert f"CREATE TABLE {table}" in prompt
    assert "FOREIGN KEY" in prompt


def test_few_shot_blocks_show_only_the_tables_their_query_uses(text2sql: Text2SqlTask) -> None:
    example = text2sql.split("dev")[0]
    shots = text2sql.few_shot_examples(4, "train")
    assert len({s.difficulty for s in shots}) == 4
    assert all(s in text2sql.split("train") for s in shots)
    prompt = text2sql.prompt(example, shots)
    for shot in shots:
        assert f"SQL: {shot.gold_sql};" in prompt
    first_block = prompt.split("Question:")[0]
    first_schema = text2sql.dataset.database(shots[0].db_id).path
    shown = {name for name, _ in schema_ddl(first_schema) if f"CREATE TABLE {name} " in first_block}
    assert shown == tables_used(shots[0].gold_sql)

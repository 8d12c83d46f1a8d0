"""Loaders for Spider- and BIRD-format folders.

Each SQLite database becomes a DuckDB file in a cache folder (sqlite_import), and each gold query is
transpiled from SQLite to DuckDB, repaired where the two engines disagree (gold_repairs), and executed
once (gold_checks); the queries that still fail are reported and left out, never dropped silently (loaders).
"""

from tasks.text2sql.sources.spider.cache import default_cache_dir
from tasks.text2sql.sources.spider.gold_repairs import (
    REPAIR_BARE_COLUMN,
    REPAIR_CASE_INSENSITIVE_LIKE,
    REPAIR_DOUBLE_QUOTED_STRING,
    REPAIR_INTEGER_DIVISION,
    REPAIR_TEXT_COMPARISON,
)
from tasks.text2sql.sources.spider.loaders import GoldFailure, LoadReport, load_bird, load_spider
from tasks.text2sql.sources.spider.sqlite_import import DUCKDB_CONFIG

__all__ = [
    "DUCKDB_CONFIG",
    "REPAIR_BARE_COLUMN",
    "REPAIR_CASE_INSENSITIVE_LIKE",
    "REPAIR_DOUBLE_QUOTED_STRING",
    "REPAIR_INTEGER_DIVISION",
    "REPAIR_TEXT_COMPARISON",
    "GoldFailure",
    "LoadReport",
    "default_cache_dir",
    "load_bird",
    "load_spider",
]

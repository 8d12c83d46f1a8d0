"""Text-to-SQL: questions over DuckDB databases, rewarded by executing the generated SQL in a sandbox."""

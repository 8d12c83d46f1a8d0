"""A table's declared keys that its DuckDB file cannot hold as constraints, kept as the table's comment.

A release's SQLite schema declares primary and foreign keys that DuckDB would enforce (its data, or a key on a column
that is not unique, may break them), so the converter does not declare them as constraints; the prompt still shows
them, as it shows the bundled data's real constraints, since a model joins tables by them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

# What a table comment written by the converter starts with; a comment without it is someone else's.
_PREFIX = "declared keys, not enforced: "


class ForeignKey(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    columns: tuple[str, ...]
    references: str
    referenced_columns: tuple[str, ...]


class DeclaredKeys(BaseModel):
    """A table's primary key columns (empty: none) and its foreign keys, as its source schema declares them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    primary_key: tuple[str, ...] = ()
    foreign_keys: tuple[ForeignKey, ...] = ()

    def as_comment(self) -> str:
        return _PREFIX + self.model_dump_json()

    @classmethod
    def of_comment(cls, comment: str | None) -> DeclaredKeys | None:
        """The keys a converter's comment holds; None for no comment or one of another kind."""
        if not comment or not comment.startswith(_PREFIX):
            return None
        try:
            return cls.model_validate_json(comment.removeprefix(_PREFIX))
        except ValidationError:
            return None

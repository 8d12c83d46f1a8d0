"""Where the text-to-SQL task's questions and databases come from: the bundled data, the synthesized training data
judged on the bundled held-out splits, or a Spider or BIRD release.

A trial config's and a study spec's `data:` is validated as a `DataSource` (the task's `data_source_type`), so a
folder that is not a release is refused there, before anything is converted; `load` reads it when the task opens.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.text2sql.dataset import Text2SqlDataset
from tasks.text2sql.errors import DatasetError
from tasks.text2sql.sources.bundled import load_bundled
from tasks.text2sql.sources.spider import load_bird, load_spider
from tasks.text2sql.sources.spider.layout import bird_layout, spider_layout
from tasks.text2sql.sources.synthesis.loader import load_synthesized
from validation_errors.environment import expand_environment, missing_variables


class SourceKind(StrEnum):
    """The formats the task reads."""

    bundled = "bundled"
    # Train on the questions `build-data` wrote; dev and test are the bundled ones, whose unseen forms judge transfer.
    synthesized = "synthesized"
    spider = "spider"
    bird = "bird"


_LAYOUTS = {SourceKind.spider: spider_layout, SourceKind.bird: bird_layout}
_LOADERS = {SourceKind.spider: load_spider, SourceKind.bird: load_bird}


class DataSource(BaseModel):
    """The data a trial trains on (its `train_split`) and is judged on (its `eval_split`): the data the project ships
    with by default; the synthesized training data (its train split) with the bundled dev and test; or the official
    release of Spider (splits train, dev, test) or BIRD (train, dev) on disk."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: SourceKind = Field(SourceKind.bundled, description="bundled, or the format of the release at `path`")
    path: Path | None = Field(
        None,
        description="the folder the Spider or BIRD release was unpacked into; ${VAR} is read from the environment "
        "(e.g. path: ${SPIDER_RELEASE}, so a shared spec need not name a user's folder)",
    )
    cache_dir: Path | None = Field(
        None,
        description="where the release's databases are kept as DuckDB files; None: "
        "~/.cache/rl-posttrain/text2sql/<source>-<hash of path>",
    )

    @field_validator("path", "cache_dir", mode="before")
    @classmethod
    def _environment_filled_in(cls, path: object) -> object:
        if not isinstance(path, str):
            return path
        try:
            return expand_environment(path)
        except ValueError as error:
            variable = missing_variables(path)[0]
            raise ValueError(f"{error}: set it to the folder (export {variable}=/path/to/it)") from None

    @field_validator("path", "cache_dir")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        # A config travels to trial processes (a subprocess, a Kubernetes Job) that may start in another folder.
        return None if path is None else path.expanduser().resolve()

    @model_validator(mode="after")
    def _a_release_where_one_is_named(self) -> DataSource:
        if self.source not in _LAYOUTS:
            named = [name for name in ("path", "cache_dir") if getattr(self, name) is not None]
            if named:
                raise ValueError(
                    f"{' and '.join(named)}: only with source spider or bird (source {self.source} ships with the "
                    "project)"
                )
            return self
        if self.path is None:
            raise ValueError(f"path: required with source {self.source} (the folder its release was unpacked into)")
        try:
            _LAYOUTS[self.source](self.path)
        except DatasetError as error:
            raise ValueError(str(error)) from None
        return self

    def load(self) -> Text2SqlDataset:
        """The data set; a release's SQLite databases are converted to DuckDB on first use and kept in the cache.

        Raises:
            DatasetError: a file of the release does not load, named with the fix.
        """
        if self.source is SourceKind.bundled:
            return load_bundled()
        if self.source is SourceKind.synthesized:
            return _synthesized_judged_on_bundled()
        assert self.path is not None  # validation asks a release for its path
        dataset, _ = _LOADERS[self.source](self.path, self.cache_dir)
        return dataset


def _synthesized_judged_on_bundled() -> Text2SqlDataset:
    synthesized, bundled = load_synthesized(), load_bundled()
    shared = sorted(synthesized.databases.keys() & bundled.databases.keys())
    if shared:  # the splits are by database: one in both would put held-out rows into training
        raise DatasetError(f"the synthesized and the bundled data both have database {shared[0]!r}; rename one")
    return Text2SqlDataset(
        name="synthesized",
        splits={"train": synthesized.split("train"), "dev": bundled.split("dev"), "test": bundled.split("test")},
        databases={**synthesized.databases, **bundled.databases},
    )

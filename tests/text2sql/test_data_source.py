"""The task's data sources: the bundled data by default, a Spider or BIRD release on request; a folder that is not a
release is refused when the source is validated, a database that does not load when the task opens, each with the
fix named."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pydantic import ValidationError
from support.spider_release import write_json, write_spider_release

from tasks.registry import open_task
from tasks.text2sql.errors import DatasetError
from tasks.text2sql.sources.data_source import DataSource, SourceKind
from tasks.text2sql.sources.spider.cache import exclusive
from tasks.text2sql.task import Text2SqlTask


@pytest.fixture
def release(tmp_path: Path) -> Path:
    return write_spider_release(tmp_path / "spider")


def refusal(**fields: object) -> str:
    with pytest.raises(ValidationError) as refused:
        DataSource.model_validate(fields)
    return str(refused.value)


def test_the_default_source_is_the_bundled_data() -> None:
    assert DataSource() == DataSource(source="bundled")
    assert DataSource().source is SourceKind.bundled and DataSource().path is None


def test_the_registry_opens_the_task_on_a_release(release: Path, tmp_path: Path) -> None:
    source = DataSource(source="spider", path=release, cache_dir=tmp_path / "cache")
    with open_task("text2sql", source) as task:
        assert isinstance(task, Text2SqlTask) and task.dataset.name == "spider"
        assert task.split_names == ("train", "dev")
        assert {e.db_id for e in task.split("train")} == {"shop"} and {e.db_id for e in task.split("dev")} == {"pets"}
        assert [e.id for e in task.split("dev")] == [f"spider-dev-{i}" for i in range(5)]
        # Spider says nothing of question forms.
        assert all(e.form is None for e in task.split("dev"))
    assert (tmp_path / "cache" / "pets.duckdb").is_file()


def test_a_relative_path_is_made_absolute(release: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(release.parent)
    source = DataSource(source="spider", path=Path(release.name), cache_dir=Path("cache"))
    assert source.path == release and source.cache_dir == release.parent / "cache"


def test_a_path_may_name_an_environment_variable_and_an_unset_one_is_named_with_the_fix(
    release: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_SPIDER_RELEASE", str(release))
    assert DataSource(source="spider", path="${TEST_SPIDER_RELEASE}").path == release
    monkeypatch.delenv("TEST_SPIDER_RELEASE")
    refused = refusal(source="spider", path="${TEST_SPIDER_RELEASE}")
    assert "refers to TEST_SPIDER_RELEASE, which the environment does not set" in refused
    assert "export TEST_SPIDER_RELEASE=" in refused


def test_a_release_needs_its_path_and_the_bundled_data_takes_none(release: Path) -> None:
    assert "path: required with source spider" in refusal(source="spider")
    assert "path: only with source spider or bird" in refusal(path=str(release))
    wrong_source = refusal(source="wikisql", path=str(release))
    assert "Input should be 'bundled', 'synthesized', 'spider' or 'bird'" in wrong_source


def test_a_path_that_is_no_folder_is_refused_with_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    assert f"{missing}: no such folder; give the folder the Spider release was unpacked into" in refusal(
        source="spider", path=str(missing)
    )
    (tmp_path / "file.zip").write_bytes(b"PK")
    assert "a file, not a folder" in refusal(source="bird", path=str(tmp_path / "file.zip"))


def test_a_folder_that_is_not_a_release_is_refused_with_the_fix(release: Path, tmp_path: Path) -> None:
    assert "no Spider split file (train_spider.json, dev.json or test.json)" in refusal(
        source="spider", path=str(tmp_path)
    )
    assert "no BIRD split file" in refusal(source="bird", path=str(tmp_path))
    # Spider's dev.json lies where BIRD's flat dev release has its own, but BIRD's tables file is not beside it.
    assert "dev_tables.json: missing; the BIRD release describes" in refusal(source="bird", path=str(release))
    (release / "tables.json").unlink()
    assert "tables.json: missing; the Spider release describes the databases" in refusal(
        source="spider", path=str(release)
    )


def test_a_release_without_its_database_folder_says_where_it_belongs(release: Path, tmp_path: Path) -> None:
    (release / "database").rename(tmp_path / "elsewhere")
    assert "database: missing (the databases of split 'train'); the release's SQLite files belong there" in refusal(
        source="spider", path=str(release)
    )
    (release / "database.zip").write_bytes(b"PK")
    assert f"unzip {release / 'database.zip'} there" in refusal(source="spider", path=str(release))


def test_a_bird_release_still_zipped_is_told_to_unzip(tmp_path: Path) -> None:
    dev = tmp_path / "bird" / "dev"
    write_json(dev / "dev.json", [])
    write_json(dev / "dev_tables.json", [])
    (dev / "dev_databases.zip").write_bytes(b"PK")
    assert f"unzip {dev / 'dev_databases.zip'} there" in refusal(source="bird", path=str(tmp_path / "bird"))


def test_a_database_that_does_not_load_is_named_with_the_fix_when_the_task_opens(release: Path, tmp_path: Path) -> None:
    (release / "database" / "pets" / "pets.sqlite").write_bytes(b"half a download" * 100)
    source = DataSource(source="spider", path=release, cache_dir=tmp_path / "cache")  # the layout is right
    with pytest.raises(DatasetError, match=r"pets\.sqlite: not a readable SQLite database .*replace it with the"):
        Text2SqlTask.open(source)


def test_a_question_on_a_database_the_release_lacks_is_named_with_the_fix(release: Path, tmp_path: Path) -> None:
    write_json(release / "tables.json", [{"db_id": "shop"}, {"db_id": "pets"}, {"db_id": "zoo"}])
    write_json(release / "dev.json", [{"db_id": "zoo", "question": "?", "query": "SELECT 1"}])
    source = DataSource(source="spider", path=release, cache_dir=tmp_path / "cache")
    with pytest.raises(DatasetError, match=r"db_id 'zoo' has no database file .*put the release's copy there"):
        Text2SqlTask.open(source)


def test_opens_of_one_release_take_turns_on_its_cache(release: Path, tmp_path: Path) -> None:
    """A study's trials open the same release at once: each database is converted by one of them, not by all."""
    cache = tmp_path / "cache"
    cache.mkdir()
    source = DataSource(source="spider", path=release, cache_dir=cache)
    opened = threading.Event()

    def open_it() -> None:
        source.load()
        opened.set()

    with exclusive(cache):
        thread = threading.Thread(target=open_it)
        thread.start()
        assert not opened.wait(2.0), "loaded while another process held the cache"
    thread.join(timeout=30)
    assert opened.is_set()

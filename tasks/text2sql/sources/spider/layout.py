"""Where a Spider or BIRD release keeps each split's files, checked without reading them.

The check is cheap (it only looks at which files and folders exist), so a trial config or a study spec that names a
release is refused at validation when the folder is not one, before any database is converted; the loaders start
from the same layout, so what validation accepts is what they read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.text2sql.errors import DatasetError
from tasks.text2sql.sources.spider.records import existing_folder


@dataclass(frozen=True)
class SplitFiles:
    """Where one split of a Spider or BIRD folder lies."""

    split: str
    records: tuple[Path, ...]
    tables: Path
    database_dirs: tuple[Path, ...]


def spider_layout(root: Path) -> tuple[Path, tuple[SplitFiles, ...]]:
    """The resolved root and the splits a Spider folder has: tables.json, train_spider.json (+ train_others.json),
    dev.json, test.json (with test_tables.json), databases in database/<db_id>/ or test_database/<db_id>/.

    Raises:
        DatasetError: not a folder, no split file, or a split without its tables file or database folder.
    """
    root = existing_folder(root, "Spider")
    database_dirs = (root / "database", root / "test_database")
    candidates = (
        SplitFiles(
            "train", (root / "train_spider.json", root / "train_others.json"), root / "tables.json", database_dirs
        ),
        SplitFiles("dev", (root / "dev.json",), root / "tables.json", database_dirs),
        SplitFiles("test", (root / "test.json",), root / "test_tables.json", database_dirs),
    )
    splits = tuple(files for files in candidates if any(path.is_file() for path in files.records))
    if not splits:
        raise DatasetError(
            f"{root}: no Spider split file (train_spider.json, dev.json or test.json); give the folder the release "
            "was unpacked into, which holds them beside tables.json and database/"
        )
    for files in splits:
        _check_split(files, "Spider")
    return root, splits


def bird_layout(root: Path) -> tuple[Path, tuple[SplitFiles, ...]]:
    """The resolved root and the splits a BIRD folder has: <split>/<split>.json with <split>_tables.json and
    <split>_databases/, for "train" and "dev"; a split's files may also lie flat in root (BIRD's dev release unpacks
    so).

    Raises:
        DatasetError: not a folder, no split file, or a split without its tables file or database folder.
    """
    root = existing_folder(root, "BIRD")
    splits = tuple(files for files in (_bird_split(root, split) for split in ("train", "dev")) if files is not None)
    if not splits:
        raise DatasetError(
            f"{root}: no BIRD split file (train/train.json, dev/dev.json or dev.json); give the folder the release was "
            "unpacked into"
        )
    for files in splits:
        _check_split(files, "BIRD")
    return root, splits


def _bird_split(root: Path, split: str) -> SplitFiles | None:
    """The files of `split` in its own folder, else flat in root; None when neither holds `<split>.json`."""
    folder = next((f for f in (root / split, root) if (f / f"{split}.json").is_file()), None)
    if folder is None:
        return None
    return SplitFiles(
        split, (folder / f"{split}.json",), folder / f"{split}_tables.json", (folder / f"{split}_databases",)
    )


def _check_split(files: SplitFiles, release: str) -> None:
    if not files.tables.is_file():
        raise DatasetError(
            f"{files.tables}: missing; the {release} release describes the databases of split {files.split!r} "
            "there: give the release's own folder, unchanged"
        )
    if any(folder.is_dir() for folder in files.database_dirs):
        return
    folder = files.database_dirs[0]
    archive = folder.with_name(folder.name + ".zip")
    fix = f"unzip {archive} there" if archive.is_file() else "the release's SQLite files belong there"
    raise DatasetError(f"{folder}: missing (the databases of split {files.split!r}); {fix}, one folder per db_id")

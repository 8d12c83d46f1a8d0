"""The synthesized data's DuckDB files: built from the seed on first use into the cache, never committed.

Each database is built in a scratch folder and renamed into place, so a build cut short leaves nothing that looks
finished. Beside the files lies the digest of what was written (schema and rows), so a question file can check
that the databases it was written over are the ones this code builds.
"""

from __future__ import annotations

import csv
import hashlib
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import duckdb
from rich.progress import Progress

from tasks.text2sql.dataset import Database
from tasks.text2sql.sources.domains.loader import DOMAINS_DIR, Family, family_files
from tasks.text2sql.sources.generation.build import default_cache_root
from tasks.text2sql.sources.generation.rows import create_table_sql, generate_rows
from tasks.text2sql.sources.synthesis.errors import SynthesisError
from tasks.text2sql.sources.synthesis.schemas import SynthDatabase, synth_databases

# The primary database and one other with the same schema and other rows, for test-suite matching.
VARIANTS = 2
# DuckDB's default 256 KiB blocks make a file of a few hundred rows per table take megabytes; 16 KiB blocks keep the
# hundreds of files small.
BLOCK_SIZE = 16_384
DIGEST_FILE = "DIGEST"
# The code that decides a database's contents, beside the domain files: a change to any of it builds into a new
# cache folder.
_SOURCES = (
    "seeding.py",
    "generation/rows.py",
    "synthesis/naming.py",
    "synthesis/schemas.py",
    "synthesis/databases.py",
)
_DATA_SOURCES_DIR = Path(__file__).resolve().parent.parent


def code_fingerprint() -> str:
    digest = hashlib.sha256()
    for source in [*(_DATA_SOURCES_DIR / s for s in _SOURCES), *family_files(Family.SYNTHESIZED)]:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def databases_root(seed: int, cache_root: Path | None = None) -> Path:
    return (cache_root or default_cache_root()) / "synthesized" / f"{seed}-{code_fingerprint()}"


def _paths(folder: Path, db_id: str) -> tuple[Path, ...]:
    return tuple(folder / (f"{db_id}.duckdb" if v == 0 else f"{db_id}.variant{v}.duckdb") for v in range(VARIANTS))


def _write_database(database: SynthDatabase, seed: int, variant: int, path: Path, digest: hashlib._Hash) -> None:
    """rows.py's rows for one variant in a new DuckDB file with small blocks; the schema and rows feed `digest`."""
    schema = database.schema
    with tempfile.TemporaryDirectory() as scratch, duckdb.connect(":memory:") as con:
        quoted = str(path).replace("'", "''")
        con.execute(f"ATTACH '{quoted}' AS db (BLOCK_SIZE {BLOCK_SIZE})")
        con.execute("USE db")
        for table in schema.tables:
            ddl = create_table_sql(schema, table)
            con.execute(ddl)
            digest.update(ddl.encode())
            csv_path = Path(scratch) / f"{table.name}.csv"
            with csv_path.open("w", newline="") as handle:
                writer = csv.writer(handle)
                for row in generate_rows(schema, table, seed, variant):
                    cells = ["\\N" if v is None else v for v in row]
                    writer.writerow(cells)
                    digest.update(repr(cells).encode())
            con.execute(f"COPY {table.name} FROM '{csv_path}' (HEADER false, NULLSTR '\\N')")
        con.execute("CHECKPOINT db")
        con.execute("USE memory")
        con.execute("DETACH db")


def _build(database: SynthDatabase, seed: int, root: Path) -> None:
    """Write one database's variants and digest into `root/<db_id>`, all at once or not at all."""
    scratch = Path(tempfile.mkdtemp(prefix=f".building-{database.db_id}-", dir=root))
    try:
        digest = hashlib.sha256()
        for variant, path in enumerate(_paths(scratch, database.db_id)):
            _write_database(database, seed, variant, path, digest)
        (scratch / DIGEST_FILE).write_text(digest.hexdigest()[:16])
    except (duckdb.Error, OSError) as error:
        shutil.rmtree(scratch, ignore_errors=True)
        raise SynthesisError(
            f"database {database.db_id} does not build from its schema ({error}); its domain file "
            f"{DOMAINS_DIR / Family.SYNTHESIZED / database.domain}.yaml or its naming style is at fault: fix it, or "
            "report it"
        ) from error
    try:
        scratch.rename(root / database.db_id)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)  # another process finished it first; its build is identical


def ensure_synth_databases(
    seed: int, db_ids: Iterable[str] | None = None, cache_root: Path | None = None, show_progress: bool = True
) -> dict[str, Database]:
    """The databases named (all of them by default), built once per seed and code version.

    Raises:
        SynthesisError: a db_id that the seed does not make, or a schema that does not build.
    """
    known = {d.db_id: d for d in synth_databases(seed)}
    wanted = list(known) if db_ids is None else list(dict.fromkeys(db_ids))
    unknown = [db_id for db_id in wanted if db_id not in known]
    if unknown:
        raise SynthesisError(
            f"no synthesized database {unknown[0]!r} for seed {seed} ({len(unknown)} unknown); "
            "the question file was built with another seed or other domain files: rebuild it with "
            "`python -m tasks.text2sql build-data`"
        )
    root = databases_root(seed, cache_root)
    root.mkdir(parents=True, exist_ok=True)
    missing = [db_id for db_id in wanted if not (root / db_id / DIGEST_FILE).exists()]
    with Progress(disable=not (show_progress and missing), transient=True) as progress:
        bar = progress.add_task(f"building {len(missing)} synthesized databases", total=len(missing))
        for db_id in missing:
            _build(known[db_id], seed, root)
            progress.advance(bar)
    return {db_id: _database(root, db_id) for db_id in wanted}


def _database(root: Path, db_id: str) -> Database:
    primary, *variants = _paths(root / db_id, db_id)
    return Database(db_id, primary, tuple(variants))


def database_digests(seed: int, db_ids: Iterable[str], cache_root: Path | None = None) -> dict[str, str]:
    """The digest of each built database (build them first with `ensure_synth_databases`)."""
    root = databases_root(seed, cache_root)
    return {db_id: (root / db_id / DIGEST_FILE).read_text().strip() for db_id in db_ids}

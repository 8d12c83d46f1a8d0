"""A throw-away PostgreSQL server for tests: its own cluster in a temporary folder, on a loopback port.

The PostgreSQL binaries (initdb, pg_ctl) come from the machine: on PATH, or Debian's /usr/lib/postgresql/N/bin.
PostgreSQL refuses to run as root, so under root the server runs as the `postgres` user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support.loopback import free_port


def postgres_bin() -> Path | None:
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(initdb).resolve().parent
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


@contextmanager
def postgres_server(database: str = "optuna") -> Iterator[str]:
    """Yield a SQLAlchemy URL (postgresql+psycopg://) of a fresh database; the server is stopped and removed after."""
    binaries = postgres_bin()
    assert binaries is not None, "no PostgreSQL binaries (initdb) on this machine"
    # Not under pytest's tmp_path: its folders are private to the user running the tests.
    folder = Path(tempfile.mkdtemp(prefix="pg-test-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", free_port()

    def run(*command: str) -> None:
        subprocess.run([*run_as, *command], check=True, capture_output=True, timeout=120)

    run(str(binaries / "initdb"), "-D", str(data), "-U", "optuna", "--auth=trust", "--no-sync")
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    run(str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "log"), "-w", "start")
    try:
        if database != "postgres":
            run(str(binaries / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "optuna", database)
        yield f"postgresql+psycopg://optuna@127.0.0.1:{port}/{database}"
    finally:
        run(str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)

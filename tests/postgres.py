"""A real PostgreSQL server for tests, from Debian's ``postgresql`` package.

Why this exists: the durable history runs on PostgreSQL in production, and its tests
must meet a real server -- its locking, its transactions, a restart -- never a mock.
:func:`running_postgres` makes a private cluster in a temporary directory and starts
it; ``.ci/run`` installs the package (and stops the cluster Debian may start: the tests
never use it).

* The binaries come from ``PATH`` or ``/usr/lib/postgresql/<version>/bin`` (Debian
  keeps ``initdb``/``pg_ctl`` off ``PATH``); the newest version wins.
* ``initdb`` refuses to run as root, so as root every server command runs as the
  ``postgres`` system user (``runuser -u postgres --``) in a directory that user owns
  (under ``/tmp``: pytest's own temporary directories are private to root).
* The server listens on 127.0.0.1 on a free port and on a unix socket in its private
  directory; authentication is ``trust`` (nothing but this machine can connect), and
  durability is off (``fsync``, ``synchronous_commit``, ``full_page_writes``): the
  tests check behaviour, and a test server needs no crash safety.
* :meth:`PostgresServer.stop` and :meth:`~PostgresServer.start` stop and start the same
  cluster on the same port, for tests of a store whose server goes away and comes back.

Start-up takes about a second (``initdb`` most of it); no process outlives the context
(``pg_ctl stop`` on the way out, then the directory is removed).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

__all__ = ["POSTGRES_MISSING", "PostgresServer", "postgres_bin_dir", "running_postgres"]

POSTGRES_MISSING = "PostgreSQL not installed (apt-get install postgresql)"
SYSTEM_USER = "postgres"
SUPERUSER = "postgres"


def postgres_bin_dir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are (None: PostgreSQL is not installed)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(p) for p in path.parent.name.split(".") if p.isdigit())

    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=version)
    return candidates[-1].parent if candidates else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class PostgresServer:
    """One private PostgreSQL cluster (see the module docstring)."""

    bin_dir: Path
    base: Path
    port: int
    as_user: list[str] = field(default_factory=list)
    """The command prefix that runs a server command as its owner (empty: ourselves)."""

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base / "socket"

    def _run(self, *args: str, timeout: float = 120) -> None:
        result = subprocess.run(
            [*self.as_user, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            log = self.base / "server.log"
            tail = log.read_text()[-3000:] if log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout}{result.stderr}\n{tail}"
            )

    def init(self) -> None:
        self._run(
            str(self.bin_dir / "initdb"),
            "--pgdata",
            str(self.data_dir),
            "--username",
            SUPERUSER,
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--locale",
            "C",
            "--no-sync",
        )

    def start(self) -> None:
        options = " ".join(
            [
                f"-p {self.port}",
                f"-k {self.socket_dir}",
                "-c listen_addresses=127.0.0.1",
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
                "-c max_connections=200",
            ]
        )
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "--pgdata",
            str(self.data_dir),
            "--log",
            str(self.base / "server.log"),
            "--options",
            options,
            "--wait",
            "--timeout",
            "60",
            "start",
        )

    def stop(self) -> None:
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "--pgdata",
            str(self.data_dir),
            "--mode",
            "fast",
            "--wait",
            "--timeout",
            "60",
            "stop",
        )

    def running(self) -> bool:
        return (self.data_dir / "postmaster.pid").exists()

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """A new database (optionally a copy of ``template``); its DSN."""
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(statement)
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(statement)


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """A fresh cluster, started; stopped and removed on exit."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise RuntimeError(POSTGRES_MISSING)
    base = Path(tempfile.mkdtemp(prefix="airt-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam(SYSTEM_USER)
        os.chown(base, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", SYSTEM_USER, "--"]
    server = PostgresServer(bin_dir, base, _free_port(), as_user)
    try:
        (server.socket_dir).mkdir()
        if as_user:
            os.chown(server.socket_dir, owner.pw_uid, owner.pw_gid)
        server.init()
        server.start()
        yield server
    finally:
        if server.running():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                server.stop()
        shutil.rmtree(base, ignore_errors=True)

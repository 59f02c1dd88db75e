"""Connecting to a store (API.md "Connecting")."""

from __future__ import annotations

from types import TracebackType

from . import _native
from ._time import check_int

__all__ = ["Journal", "Storage", "WorkStore", "connect", "redact_url", "upgrade"]


def redact_url(url: str) -> str:
    """``url`` as it may be shown to people (logs, dashboards): its password replaced by ``***``.

    Args:
        url: A store URL (``sqlite:...``, ``postgres://...``, ``mysql://...``).

    Returns:
        The URL with the password of its ``user:password@`` part and any query parameter
        naming a password, secret or token (``password=``, ``sslpassword=``) shown as
        ``***``; a URL without one is returned unchanged.

    Raises:
        TypeError: ``url`` is not a str.
    """
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    return _native.redact_url(url)


class WorkStore:
    """The work store of a :class:`Storage`: jobs and events. Shares the storage's pool."""

    __slots__ = ("_storage",)

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    @property
    def storage(self) -> Storage:
        """The :class:`Storage` this work store belongs to."""
        return self._storage


class Journal:
    """The journal of a :class:`Storage`: durable runs, steps, locks, triggers."""

    __slots__ = ("_storage",)

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    @property
    def storage(self) -> Storage:
        """The :class:`Storage` this journal belongs to."""
        return self._storage


class Storage:
    """An open store: one connection pool shared by :attr:`work` and :attr:`journal`.

    Create one with :func:`connect`. Use ``async with`` (or :meth:`close`) to close the pool.

    Attributes:
        url: The URL it was opened with (password included: it is what connects; ``repr``
            shows it with the password as ``***``).
        work: The work store (jobs, events).
        journal: The journal (durable runs, steps).
    """

    __slots__ = ("_closed", "_native", "journal", "url", "work")

    def __init__(self, native: _native.NativeStore, url: str) -> None:
        self._native = native
        self._closed = False
        self.url = url
        self.work = WorkStore(self)
        self.journal = Journal(self)

    @property
    def backend(self) -> str:
        """``"sqlite"``, ``"postgres"`` or ``"mysql"``."""
        return self._native.backend

    @property
    def redacted_url(self) -> str:
        """:attr:`url` with its password replaced by ``***`` (see :func:`redact_url`)."""
        return redact_url(self.url)

    @property
    def query_count(self) -> int:
        """The number of SQL statements this storage has sent."""
        return self._native.query_count

    async def now_ms(self) -> int:
        """The store's clock, epoch ms UTC (SQLite: this machine's clock).

        All lease, lock and due-time decisions use it.
        """
        return await self._native.now_ms()

    async def schema_version(self) -> int | None:
        """The schema version the store is at (None: it has no gnl schema yet)."""
        return await self._native.schema_version()

    async def close(self) -> None:
        """Close the pool. Idempotent."""
        if not self._closed:
            self._closed = True
            await self._native.close()

    async def __aenter__(self) -> Storage:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<gnl.Storage {self.backend} {self.redacted_url!r}>"


def native_of(store: Storage | WorkStore | Journal, what: str = "work") -> _native.NativeStore:
    """The native store behind a Storage, WorkStore or Journal.

    Raises:
        TypeError: ``store`` is none of them, or is the other half (a Journal where a work
            store is asked for, or the reverse).
    """
    if isinstance(store, Storage):
        return store._native
    expected = WorkStore if what == "work" else Journal
    if isinstance(store, expected):
        return store.storage._native
    name = "storage.work" if what == "work" else "storage.journal"
    raise TypeError(f"expected a gnl.Storage or {name}, not {type(store).__name__}")


def storage_of(store: Storage | WorkStore | Journal) -> Storage:
    """The Storage of a Storage, WorkStore or Journal."""
    if isinstance(store, Storage):
        return store
    if isinstance(store, (WorkStore, Journal)):
        return store.storage
    raise TypeError(f"expected a gnl.Storage, not {type(store).__name__}")


async def connect(
    url: str,
    *,
    max_connections: int = 10,
    create: bool = True,
    read_timeout_ms: int | None = None,
) -> Storage:
    """Open a store.

    Args:
        url: ``sqlite:///relative/path.db`` (relative to the working directory),
            ``sqlite:////absolute/path.db``, ``sqlite::memory:``, ``postgres://…`` /
            ``postgresql://…`` or ``mysql://…``.
        max_connections: Size of the connection pool (SQLite in memory always uses one).
        create: Give an empty store the current schema.
        read_timeout_ms: Cut off the store's dashboard reads after this long, 1 to 600,000
            ms (None: never): the listings and look-ups Studio's pages make
            (:func:`list_orgs`, :func:`list_jobs`, :func:`scan_jobs`, :func:`get_job`,
            :func:`list_runs`, :func:`scan_runs`, :func:`get_run`, :func:`list_triggers`,
            :func:`list_consumers`, :func:`list_dead_events`, :func:`consumer_lag`) fail with
            :class:`GnlError` instead of running longer (Postgres ``statement_timeout``, MySQL
            ``max_execution_time``, MariaDB ``max_statement_time``, SQLite an interrupt).

    Returns:
        The open :class:`Storage`.

    Raises:
        TypeError: ``url`` is not a str.
        InvalidArgumentError: an unsupported scheme (the message names the accepted ones);
            a SQLite file whose directory does not exist (gnl creates the file, never its
            directory: a setup error, which retrying cannot mend).
        SchemaOutdatedError: the store's schema is older than this package (its message names
            ``gnl upgrade <url>``), or the store is empty and ``create`` is False.
        SchemaTooNewError: the store's schema is newer than this package.
        UnsupportedStoreError: the server is too old, or this build has no engine for it.
        StoreUnavailableError: the store cannot be reached (the message gives the driver's
            reason, e.g. a refused connection; also: ``create`` is False and there is no
            SQLite file at the path; none is created).
        GnlError: the server refused the connection for good (e.g. the database does not
            exist; the message is the server's, with its SQLSTATE / error number).
    """
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    check_int(max_connections, "max_connections", 1, 10_000)
    if not isinstance(create, bool):
        raise TypeError(f"create must be a bool, not {type(create).__name__}")
    if read_timeout_ms is not None:
        check_int(read_timeout_ms, "read_timeout_ms", 1, 600_000)
    native = await _native.connect(url, max_connections, create, read_timeout_ms or 0)
    return Storage(native, url)


async def upgrade(url: str) -> int:
    """Bring a store to the current schema. Idempotent; safe when two processes run it at once.

    Returns:
        The schema version the store is at now.

    Raises:
        SchemaTooNewError: the store is newer than this package.
        StoreUnavailableError: the store cannot be reached.
    """
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    return await _native.upgrade(url)

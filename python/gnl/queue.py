"""The queue's store calls (API.md "Queue"): enqueue, listings, retry and cancel.

The worker lives in :mod:`gnl.worker`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from . import _native
from ._time import check_int
from .errors import InvalidArgumentError
from .storage import Storage, WorkStore, native_of

__all__ = [
    "JSON",
    "JobCounts",
    "JobInfo",
    "JobSpec",
    "Page",
    "cancel_job",
    "count_jobs",
    "enqueue",
    "enqueue_many",
    "get_job",
    "list_all_jobs",
    "list_jobs",
    "list_orgs",
    "retry_job",
    "scan_jobs",
]

#: A JSON value: dict with str keys, list, str, int, float, bool or None.
JSON = Any

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job for :func:`enqueue_many` (a dict ``{"type", "payload", "options"}`` works too).

    Attributes:
        type: The handler key.
        payload: A JSON value.
        id: The job id within its organization; None generates a time-ordered id.
        org_id: The organization (its lane); None: no organization.
        run_at: Not claimed before this instant (epoch ms or aware datetime).
        delay_ms: Not claimed before now + this many ms (store clock).
        max_depth: Refuse the call when the organization's pending jobs would exceed it.
    """

    type: str
    payload: JSON = None
    id: str | None = None
    org_id: str | None = None
    run_at: int | datetime | None = None
    delay_ms: int | None = None
    max_depth: int | None = None

    # Lets the native core recognise a JobSpec without importing this module.
    __gnl_job_spec__ = True


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A job as stored. Instants are epoch ms UTC (store clock).

    Attributes:
        id: The job id.
        type: The handler key.
        org_id: Its organization, or None.
        payload: The JSON payload.
        state: ``pending``, ``running``, ``done``, ``dead`` or ``canceled``.
        attempts: Attempts used (counted at claim time).
        max_attempts: The limit set by the worker that last claimed it (5 before any claim).
        last_error: The error of the last failed attempt, or why it was canceled.
        result: The handler's return value (``done`` jobs).
        created_at: When it was enqueued.
        updated_at: When it last changed.
        run_at: When it is (or was) due.
        finished_at: When it reached done, dead or canceled; None before.
    """

    id: str
    type: str
    org_id: str | None
    payload: JSON
    state: str
    attempts: int
    max_attempts: int
    last_error: str | None
    result: JSON
    created_at: int
    updated_at: int
    run_at: int
    finished_at: int | None

    @property
    def run_id(self) -> str:
        """The job's durable run id: its handler's ``ctx.run_id``, the same across reclaims
        and retries."""
        return _native.job_run_id(self.org_id, self.id)


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing.

    Attributes:
        items: The records on this page.
        next_cursor: Pass as ``cursor=`` for the next page; None on the last page.
    """

    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class JobCounts:
    """One organization's latest jobs counted (:func:`count_jobs`). Bounded: the counts are
    exact only when ``complete``; else they are those of the latest ``scanned`` jobs.

    Attributes:
        org_id: The organization, or None (jobs without organization).
        states: Jobs by state among those examined (states with none are left out).
        scanned: Jobs examined: the organization's latest, at most the scan bound.
        complete: True when ``scanned`` is below the bound, so every job was counted.
        finished_per_minute: Jobs among those examined that finished (done, dead or
            canceled) in each minute of the window, oldest minute first; each entry is a
            dict state -> jobs.
    """

    org_id: str | None
    states: dict[str, int]
    scanned: int
    complete: bool
    finished_per_minute: list[dict[str, int]]


def _job_info(raw: _native.RawJob) -> JobInfo:
    return JobInfo(
        id=raw.id,
        type=raw.type,
        org_id=raw.org_id,
        payload=json.loads(raw.payload),
        state=raw.state,
        attempts=raw.attempts,
        max_attempts=raw.max_attempts,
        last_error=raw.last_error,
        result=None if raw.result is None else json.loads(raw.result),
        created_at=raw.created_at,
        updated_at=raw.updated_at,
        run_at=raw.run_at,
        finished_at=raw.finished_at,
    )


def _opt_str(value: object, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a str or None, not {type(value).__name__}")
    return value


async def enqueue(
    work: WorkStore | Storage,
    type: str,
    payload: JSON,
    *,
    id: str | None = None,
    org_id: str | None = None,
    run_at: int | datetime | None = None,
    delay_ms: int | None = None,
    max_depth: int | None = None,
) -> str:
    """Enqueue one job.

    Args:
        work: ``storage.work`` (or the Storage).
        type: The handler key (non-empty, at most 200 characters).
        payload: A JSON value.
        id: The job id; an id already enqueued in the same organization (any state) is the
            same job: its id is returned and nothing is written. None: a generated
            time-ordered id.
        org_id: The organization (non-empty, at most 200 characters, no control
            characters); None: no organization.
        run_at: Not claimed before this instant (epoch ms or aware datetime).
        delay_ms: Not claimed before now + ``delay_ms`` (store clock). Not with ``run_at``.
        max_depth: Refuse when the organization's pending jobs would exceed it (>= 1).

    Returns:
        The job id.

    Raises:
        TypeError: an argument of the wrong type, or a payload that is not JSON.
        InvalidArgumentError: a bad value (empty type, bad org_id, NaN in the payload,
            naive datetime, negative delay, both run_at and delay_ms, max_depth < 1).
        QueueFullError: ``max_depth`` would be exceeded.
        StoreUnavailableError: the store cannot be reached.
    """
    spec = JobSpec(type, payload, id, org_id, run_at, delay_ms, max_depth)
    ids = await native_of(work).enqueue([spec], True)
    return ids[0]


async def enqueue_many(
    work: WorkStore | Storage, jobs: Iterable[JobSpec | Mapping[str, Any]]
) -> list[str]:
    """Enqueue many jobs in one transaction: all or none.

    Each job is a :class:`JobSpec` or a dict ``{"type", "payload", "options"}`` whose options
    are those of :func:`enqueue` (``id``, ``org_id``, ``run_at``, ``delay_ms``,
    ``max_depth``). An id already enqueued, or repeated in the call, is one job. ``max_depth``
    counts the call's own jobs. Each organization's lane takes its turn once per call. There
    is no limit on the number of jobs (the store's parameter limits are handled inside).

    Returns:
        The job ids, in call order.

    Raises:
        InvalidJobError: a job is invalid (``.index`` is its position, ``__cause__`` the
            ``TypeError`` or ``InvalidArgumentError``); nothing was written.
        TypeError: ``jobs`` is not iterable.
        QueueFullError: a ``max_depth`` would be exceeded; nothing was written.
        StoreUnavailableError: the store cannot be reached; nothing was written.
    """
    if isinstance(jobs, (str, bytes, Mapping)):
        raise TypeError("jobs must be a list of gnl.JobSpec or dicts, not a single value")
    if not isinstance(jobs, (list, tuple)):
        jobs = list(jobs)
    return await native_of(work).enqueue(jobs, False)


async def get_job(
    work: WorkStore | Storage, job_id: str, org_id: str | None = None
) -> JobInfo | None:
    """The job ``job_id`` of organization ``org_id`` (None: no organization), or None.

    Raises:
        InvalidArgumentError: ``job_id`` is empty (no job has an empty id), or ``org_id`` is
            not a valid organization id.
    """
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str, not {type(job_id).__name__}")
    raw = await native_of(work).get_job(_opt_str(org_id, "org_id"), job_id)
    return None if raw is None else _job_info(raw)


async def list_jobs(
    work: WorkStore | Storage,
    *,
    org_id: str | None = None,
    state: str | None = None,
    type: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Page[JobInfo]:
    """One lane's jobs in enqueue order, a page at a time.

    Without ``org_id`` it lists only jobs that have no organization. A listing is fixed at its
    first page: every job enqueued before it is listed exactly once; one enqueued after it
    belongs to the next listing.

    Args:
        org_id: The lane; None: jobs without organization.
        state: Only jobs in this state (``pending``, ``running``, ``done``, ``dead``,
            ``canceled``).
        type: Only jobs of this type.
        limit: Page size, 1 to 10,000.
        cursor: ``next_cursor`` of the previous page.

    Raises:
        InvalidArgumentError: a bad state or limit, or a cursor from another function or
            other filters, or a garbled one.
    """
    check_int(limit, "limit", 1, 10_000)
    raw, nxt = await native_of(work).list_jobs(
        False,
        _opt_str(org_id, "org_id"),
        _opt_str(state, "state"),
        _opt_str(type, "type"),
        limit,
        _opt_str(cursor, "cursor"),
    )
    return Page([_job_info(r) for r in raw], nxt)


async def list_all_jobs(
    work: WorkStore | Storage, *, limit: int = 100, cursor: str | None = None
) -> Page[JobInfo]:
    """Every job on the store: jobs without organization first, then each organization's lane
    in name order, each in enqueue order. Fixed at its first page, like :func:`list_jobs`.

    Raises:
        InvalidArgumentError: a bad limit, or a cursor that ``list_all_jobs`` did not produce.
    """
    check_int(limit, "limit", 1, 10_000)
    raw, nxt = await native_of(work).list_jobs(
        True, None, None, None, limit, _opt_str(cursor, "cursor")
    )
    return Page([_job_info(r) for r in raw], nxt)


async def retry_job(work: WorkStore | Storage, job_id: str, org_id: str | None = None) -> bool:
    """Send a ``dead`` job back to ``pending`` with attempts 0.

    Returns:
        True if it was dead; False (and nothing changes) for any other state or an unknown id.

    Raises:
        InvalidArgumentError: ``job_id`` is empty (no job has an empty id).
    """
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str, not {type(job_id).__name__}")
    return await native_of(work).retry_job(_opt_str(org_id, "org_id"), job_id)


async def cancel_job(
    work: WorkStore | Storage,
    job_id: str,
    org_id: str | None = None,
    reason: str | None = None,
) -> bool:
    """Cancel a job.

    A ``pending`` job becomes ``canceled`` at once. A ``running`` one has its handler's
    ``ctx.signal`` aborted with ``why="canceled"`` as soon as its worker hears of the cancel
    (this process: at once; another process: the Postgres notification, SQLite's change
    check within ~0.5 s, MySQL's check every 500 ms; at the latest at the worker's next lease
    renewal, within ``ttl_ms / 3``, should a notification be lost; docs/DECISIONS.md
    "Wake-ups") and becomes ``canceled`` when the handler returns; it is never retried.

    Args:
        job_id: The job's id.
        org_id: Its organization (None: no organization).
        reason: Recorded as ``last_error``, ``canceled: <reason>``; None records
            ``canceled: cancel_job was called``. An empty reason, or one longer than 10,000
            characters, is refused.

    Raises:
        InvalidArgumentError: ``job_id`` or ``reason`` is empty, or ``reason`` is longer
            than 10,000 characters.
        TypeError: ``job_id`` is not a str, ``org_id`` or ``reason`` not a str or None.

    Returns:
        True for a pending or running job; False for a finished or unknown one.
    """
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str, not {type(job_id).__name__}")
    return await native_of(work).cancel_job(
        _opt_str(org_id, "org_id"), job_id, _opt_str(reason, "reason")
    )


async def list_orgs(
    work: WorkStore | Storage, *, limit: int = 100, after: str | None = None
) -> list[str | None]:
    """Organizations that have jobs (or had), in name order, a page at a time.

    The no-organization lane, when it exists, comes first as None. One bounded query.

    Args:
        limit: At most this many, 1 to 10,000.
        after: Only names after this one: the last of the previous page (``""`` when that
            was the no-organization lane); None: from the start.

    Raises:
        InvalidArgumentError: a bad limit.
    """
    check_int(limit, "limit", 1, 10_000)
    # None after a page: the no-organization lane sorts first as "".
    return await native_of(work).list_orgs(_opt_str(after, "after"), limit)


async def count_jobs(
    work: WorkStore | Storage,
    org_ids: Iterable[str | None],
    *,
    scan: int = 1_000,
    window_ms: int = 3_600_000,
    timeout_ms: int = 5_000,
) -> list[JobCounts]:
    """Count each organization's latest jobs by state, and those that finished recently.

    Bounded: each organization costs one query that reads at most its ``scan`` latest jobs
    along the lane's key, never a count of the whole table; a figure is an estimate (a
    lower bound) when ``JobCounts.complete`` is False.

    Args:
        org_ids: The organizations (None: jobs without organization), at most 1,000.
        scan: Jobs examined per organization, 1 to 100,000.
        window_ms: ``finished_per_minute`` covers the last ``window_ms`` (store clock), one
            entry per minute, 60,000 to 86,400,000.
        timeout_ms: Each query is cut off after this long (Postgres ``statement_timeout``,
            MySQL ``max_execution_time``, MariaDB ``max_statement_time``, SQLite an
            interrupt), 1 to 600,000.

    Returns:
        One :class:`JobCounts` per organization, in order.

    Raises:
        InvalidArgumentError: a bad bound or organization.
        GnlError: a query ran out of time (Postgres, MySQL).
    """
    orgs = [_opt_str(o, "org_id") for o in org_ids]
    if len(orgs) > 1_000:
        raise InvalidArgumentError(f"at most 1000 organizations per call, got {len(orgs)}")
    check_int(scan, "scan", 1, 100_000)
    check_int(window_ms, "window_ms", 60_000, 86_400_000)
    check_int(timeout_ms, "timeout_ms", 1, 600_000)
    native = native_of(work)
    now = await native.now_ms()
    minutes = window_ms // 60_000
    since = now - minutes * 60_000
    raw = await native.count_jobs(orgs, scan, since, timeout_ms)
    out = []
    for org, (states, scanned, finished) in zip(orgs, raw, strict=True):
        per_minute: list[dict[str, int]] = [{} for _ in range(minutes)]
        for minute, state, n in finished:
            if 0 <= minute < minutes:
                per_minute[minute][state] = per_minute[minute].get(state, 0) + n
        out.append(JobCounts(org, dict(states), scanned, scanned < scan, per_minute))
    return out


async def scan_jobs(
    work: WorkStore | Storage,
    *,
    org_id: str | None = None,
    state: str | None = None,
    type: str | None = None,
    limit: int = 50,
    scan: int = 5_000,
    cursor: str | None = None,
) -> Page[JobInfo]:
    """A filtered listing over every organization (or one), bounded per page.

    Lists in :func:`list_all_jobs` order (jobs without organization first, then each lane in
    name order, each in enqueue order), fixed at its first page like it. Each page examines at
    most ``scan`` jobs along the key and returns those matching the filters, so a page may
    hold fewer than ``limit`` jobs, even none, while ``next_cursor`` says more are left:
    however rare the matches, no page reads more than ``scan`` jobs.

    Args:
        org_id: Only this organization; None: every organization; ``""``: only jobs without
            organization.
        state: Only jobs in this state.
        type: Only jobs of this type.
        limit: At most this many jobs per page, 1 to 10,000.
        scan: At most this many jobs examined per page, 1 to 100,000 (and >= ``limit``).
        cursor: ``next_cursor`` of the previous page (same filters).

    Raises:
        InvalidArgumentError: a bad state, limit or scan, or a cursor from another listing.
    """
    check_int(limit, "limit", 1, 10_000)
    check_int(scan, "scan", limit, 100_000)
    raw, nxt = await native_of(work).scan_jobs(
        _opt_str(org_id, "org_id"),
        _opt_str(state, "state"),
        _opt_str(type, "type"),
        limit,
        scan,
        _opt_str(cursor, "cursor"),
    )
    return Page([_job_info(r) for r in raw], nxt)

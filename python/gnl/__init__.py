"""gnl: durable background work for Python — a job queue, a cron scheduler and an event log
on SQLite (embedded default), Postgres or MySQL, with a native (Rust) hot path.

Everything public is exported here (API.md is the contract).
"""

from __future__ import annotations

from . import _bridge  # noqa: F401  (registers the exit hook)
from .cron import cron_times, next_cron_time, parse_field
from .errors import (
    CronError,
    ExecutionRevokedError,
    GnlError,
    InvalidArgumentError,
    InvalidJobError,
    QueueFullError,
    RunBusyError,
    SchemaOutdatedError,
    SchemaTooNewError,
    StoreUnavailableError,
    TriggerConflictError,
    UnsupportedStoreError,
)
from .queue import (
    JSON,
    JobCounts,
    JobInfo,
    JobSpec,
    Page,
    cancel_job,
    count_jobs,
    enqueue,
    enqueue_many,
    get_job,
    list_all_jobs,
    list_jobs,
    list_orgs,
    retry_job,
    scan_jobs,
)
from .signal import RevocationSignal
from .storage import Journal, Storage, WorkStore, connect, upgrade
from .worker import DrainResult, Handler, JobContext, Worker, create_worker

__version__ = "0.1.0"

__all__ = [
    "JSON",
    "CronError",
    "JobCounts",
    "DrainResult",
    "ExecutionRevokedError",
    "GnlError",
    "Handler",
    "InvalidArgumentError",
    "InvalidJobError",
    "JobContext",
    "JobInfo",
    "JobSpec",
    "Journal",
    "Page",
    "QueueFullError",
    "RevocationSignal",
    "RunBusyError",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "Storage",
    "StoreUnavailableError",
    "TriggerConflictError",
    "UnsupportedStoreError",
    "WorkStore",
    "Worker",
    "__version__",
    "cancel_job",
    "connect",
    "count_jobs",
    "create_worker",
    "cron_times",
    "enqueue",
    "enqueue_many",
    "get_job",
    "list_all_jobs",
    "list_jobs",
    "list_orgs",
    "next_cron_time",
    "parse_field",
    "retry_job",
    "scan_jobs",
    "upgrade",
]

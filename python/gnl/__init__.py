"""gnl: durable background work for Python — a job queue, a cron scheduler and an event log
on SQLite (embedded default), Postgres or MySQL, with a native (Rust) hot path.

Everything public is exported here (API.md is the contract).
"""

from __future__ import annotations

from . import _bridge  # noqa: F401  (registers the exit hook)
from .cron import cron_times, next_cron_time, parse_field
from .durable import (
    Gnl,
    RunInfo,
    RunSuspended,
    StepInfo,
    Workflow,
    WorkflowContext,
    WorkflowWaker,
    claim,
    create_gnl,
    create_workflow_waker,
    get_run,
    list_runs,
    resolve_step,
)
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
    StepOutcomeUnknownError,
    StoreUnavailableError,
    TriggerConflictError,
    UnsupportedStoreError,
)
from .queue import (
    JSON,
    JobInfo,
    JobSpec,
    Page,
    cancel_job,
    enqueue,
    enqueue_many,
    get_job,
    list_all_jobs,
    list_jobs,
    retry_job,
)
from .scheduler import (
    PollResult,
    Runner,
    Scheduler,
    TriggerInfo,
    create_scheduler,
    list_triggers,
    poll_scheduler,
    schedule_workflow,
    unschedule,
)
from .signal import RevocationSignal
from .storage import Journal, Storage, WorkStore, connect, upgrade
from .worker import DrainResult, Handler, JobContext, Worker, create_worker

__version__ = "0.1.0"

__all__ = [
    "unschedule",
    "schedule_workflow",
    "poll_scheduler",
    "list_triggers",
    "create_scheduler",
    "TriggerInfo",
    "Scheduler",
    "Runner",
    "PollResult",
    "CronError",
    "DrainResult",
    "ExecutionRevokedError",
    "Gnl",
    "GnlError",
    "Handler",
    "InvalidArgumentError",
    "InvalidJobError",
    "JSON",
    "JobContext",
    "JobInfo",
    "JobSpec",
    "Journal",
    "Page",
    "QueueFullError",
    "RevocationSignal",
    "RunBusyError",
    "RunInfo",
    "RunSuspended",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "StepInfo",
    "StepOutcomeUnknownError",
    "Storage",
    "StoreUnavailableError",
    "TriggerConflictError",
    "UnsupportedStoreError",
    "WorkStore",
    "Worker",
    "Workflow",
    "WorkflowContext",
    "WorkflowWaker",
    "__version__",
    "cancel_job",
    "claim",
    "connect",
    "create_gnl",
    "create_worker",
    "create_workflow_waker",
    "cron_times",
    "enqueue",
    "enqueue_many",
    "get_job",
    "get_run",
    "list_all_jobs",
    "list_jobs",
    "list_runs",
    "next_cron_time",
    "parse_field",
    "resolve_step",
    "retry_job",
    "upgrade",
]

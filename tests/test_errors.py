"""API.md "Errors": the hierarchy, and what users reach through ``import gnl``."""

from __future__ import annotations

import pytest

import gnl

ALL_ERRORS = [
    "GnlError",
    "InvalidArgumentError",
    "CronError",
    "InvalidJobError",
    "QueueFullError",
    "TriggerConflictError",
    "ExecutionRevokedError",
    "RunBusyError",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "UnsupportedStoreError",
    "StoreUnavailableError",
]


@pytest.mark.parametrize("name", ALL_ERRORS)
def test_every_error_is_exported_and_is_a_gnl_error(name: str) -> None:
    cls = getattr(gnl, name)
    assert isinstance(cls, type) and issubclass(cls, Exception)
    assert issubclass(cls, gnl.GnlError)
    assert name in gnl.__all__


def test_hierarchy() -> None:
    assert issubclass(gnl.InvalidArgumentError, gnl.GnlError)
    assert issubclass(gnl.InvalidArgumentError, ValueError)
    for sub in (gnl.CronError, gnl.InvalidJobError):
        assert issubclass(sub, gnl.InvalidArgumentError)
        assert issubclass(sub, ValueError)
    for cls in (
        gnl.QueueFullError,
        gnl.TriggerConflictError,
        gnl.ExecutionRevokedError,
        gnl.RunBusyError,
        gnl.SchemaOutdatedError,
        gnl.SchemaTooNewError,
        gnl.UnsupportedStoreError,
        gnl.StoreUnavailableError,
    ):
        assert issubclass(cls, gnl.GnlError)
        assert not issubclass(cls, gnl.InvalidArgumentError)
        assert not issubclass(cls, ValueError)
    # The wrong-type exception is plain TypeError, outside the hierarchy.
    assert not issubclass(TypeError, gnl.GnlError)
    assert not issubclass(gnl.GnlError, TypeError)


def test_error_attributes() -> None:
    e = gnl.ExecutionRevokedError("lease-lost")
    assert e.why == "lease-lost"
    assert "lease-lost" in str(e)
    assert gnl.RunBusyError("busy", at_lock_acquisition=True).at_lock_acquisition is True
    assert gnl.RunBusyError("busy").at_lock_acquisition is False
    job_err = gnl.InvalidJobError("job 3 is invalid", index=3)
    assert job_err.index == 3 and "job 3" in str(job_err)
    with pytest.raises(ValueError):
        raise gnl.InvalidArgumentError("bad")


def test_revocation_signal_is_usable_by_users() -> None:
    sig = gnl.RevocationSignal()
    assert not sig.aborted and sig.reason is None
    sig.raise_if_aborted()
    sig.abort("timeout")
    assert sig.aborted
    assert isinstance(sig.reason, gnl.ExecutionRevokedError) and sig.reason.why == "timeout"
    sig.abort("canceled")  # the first reason is kept
    assert sig.reason.why == "timeout"
    with pytest.raises(gnl.ExecutionRevokedError) as info:
        sig.raise_if_aborted()
    assert info.value.why == "timeout"
    with pytest.raises(gnl.InvalidArgumentError):
        gnl.RevocationSignal().abort("because")


async def test_revocation_signal_wait() -> None:
    import asyncio

    sig = gnl.RevocationSignal()
    waiter = asyncio.ensure_future(sig.wait())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    sig.abort("canceled")
    reason = await asyncio.wait_for(waiter, 1)
    assert reason.why == "canceled"
    assert (await sig.wait()) is reason


def test_public_names_exist() -> None:
    for name in gnl.__all__:
        assert hasattr(gnl, name), name
    for name in (
        "connect",
        "upgrade",
        "Storage",
        "enqueue",
        "enqueue_many",
        "create_worker",
        "list_jobs",
        "list_all_jobs",
        "get_job",
        "retry_job",
        "cancel_job",
        "JobSpec",
        "JobInfo",
        "Page",
        "DrainResult",
        "JobContext",
        "RevocationSignal",
    ):
        assert name in gnl.__all__, name


def test_records_are_frozen_dataclasses() -> None:
    import dataclasses

    for cls in (gnl.JobInfo, gnl.JobSpec, gnl.Page, gnl.DrainResult):
        assert dataclasses.is_dataclass(cls)
        assert getattr(cls, "__dataclass_params__").frozen, cls  # noqa: B009
    fields = [f.name for f in dataclasses.fields(gnl.JobInfo)]
    assert fields == [
        "id",
        "type",
        "org_id",
        "payload",
        "state",
        "attempts",
        "max_attempts",
        "last_error",
        "result",
        "created_at",
        "updated_at",
        "run_at",
        "finished_at",
    ]
    assert [f.name for f in dataclasses.fields(gnl.DrainResult)] == [
        "processed",
        "succeeded",
        "failed",
    ]
    assert [f.name for f in dataclasses.fields(gnl.Page)] == ["items", "next_cursor"]


async def test_a_native_task_that_panics_raises_gnl_error() -> None:
    # Every native awaitable runs in one tokio task whose panic is caught where it is polled
    # (rust/src/py/mod.rs `spawn`): the awaiting coroutine gets a GnlError, and the next call
    # works.
    from gnl import _native

    with pytest.raises(gnl.GnlError, match="panicked"):
        await _native.panic_in_task()
    with pytest.raises(gnl.GnlError, match="panicked"):
        await _native.panic_in_task()

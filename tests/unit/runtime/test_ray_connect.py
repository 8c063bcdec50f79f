"""Connecting to a Ray cluster: a Ray Client head that fails to start this client's server is
asked again, a bounded number of times; other failures are not retried, and a failed attempt
leaves nopelab's SIGTERM handler in place."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from nopelab.errors import UserError
from nopelab.runtime import cluster


class FlakyRay:
    """``start_ray`` that raises ``error`` on its first ``failures`` calls, then connects."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self, address: str) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error


ABORTED = ConnectionAbortedError(
    "Initialization failure from server:\nTraceback (most recent call last):\n"
    "RuntimeError: Starting Ray client server failed. See ray_client_server_23000.err for "
    "detailed logs."
)
REFUSED = ConnectionAbortedError("Initialization failure from server:\nValueError: bad runtime_env")


@pytest.fixture
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster.time, "sleep", lambda seconds: None)


@pytest.mark.parametrize("failures", range(cluster.CLIENT_ATTEMPTS))
def test_a_ray_client_head_that_fails_to_start_the_server_is_asked_again(
    failures: int, monkeypatch: pytest.MonkeyPatch, no_pause: None
) -> None:
    ray = FlakyRay(failures, ABORTED)
    monkeypatch.setattr(cluster, "start_ray", ray)
    cluster._start_client("ray://head:10001")
    assert ray.calls == failures + 1


def test_after_the_last_attempt_connect_ray_refuses_in_one_line(
    monkeypatch: pytest.MonkeyPatch, no_pause: None
) -> None:
    ray = FlakyRay(cluster.CLIENT_ATTEMPTS, ABORTED)
    monkeypatch.setattr(cluster, "start_ray", ray)
    with pytest.raises(UserError) as refused:
        cluster.connect_ray("ray://head:10001")
    assert ray.calls == cluster.CLIENT_ATTEMPTS
    assert str(refused.value) == (
        "--address: cannot connect to a Ray cluster at ray://head:10001: "
        "Initialization failure from server: RuntimeError: Starting Ray client server failed. "
        "See ray_client_server_23000.err for detailed logs."
    )


@pytest.mark.parametrize(
    ("address", "error"),
    [
        ("head:6379", ABORTED),
        ("ray://head:10001", ConnectionError("refused")),
        ("ray://head:10001", REFUSED),
    ],
)
def test_other_failures_are_not_retried(
    address: str, error: Exception, monkeypatch: pytest.MonkeyPatch, no_pause: None
) -> None:
    """A cluster address that is not Ray Client's, an address nobody answers at, or a head that
    refuses this client for a reason that a second attempt would meet again."""
    ray = FlakyRay(1, error)
    monkeypatch.setattr(cluster, "start_ray", ray)
    with pytest.raises(type(error)):
        cluster._start_client(address)
    assert ray.calls == 1


def test_a_failed_connection_leaves_the_sigterm_handler_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray's init sets its own SIGTERM handler (the driver aborts) before it connects; a failed
    attempt must not leave it behind for the retry to keep."""
    ray = pytest.importorskip("ray")

    def failing_init(**kwargs: Any) -> None:
        signal.signal(signal.SIGTERM, lambda *args: None)  # what Ray's init does first
        raise ABORTED

    def ours(*args: Any) -> None: ...

    monkeypatch.setattr(ray, "init", failing_init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    before = signal.signal(signal.SIGTERM, ours)
    try:
        with pytest.raises(ConnectionAbortedError):
            cluster.start_ray("ray://head:10001")
        assert signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, before)

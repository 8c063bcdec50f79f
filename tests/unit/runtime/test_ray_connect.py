"""Connecting to a Ray cluster: a Ray Client head that fails to start this client's server is
asked again, a bounded number of times; other failures are not retried."""

from __future__ import annotations

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


ABORTED = ConnectionAbortedError("Initialization failure from server:\nRuntimeError: failed")


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
        "Initialization failure from server: RuntimeError: failed"
    )


@pytest.mark.parametrize(
    ("address", "error"),
    [("head:6379", ABORTED), ("ray://head:10001", ConnectionError("refused"))],
)
def test_other_failures_are_not_retried(
    address: str, error: Exception, monkeypatch: pytest.MonkeyPatch, no_pause: None
) -> None:
    """A cluster address that is not Ray Client's, or an address nobody answers at."""
    ray = FlakyRay(1, error)
    monkeypatch.setattr(cluster, "start_ray", ray)
    with pytest.raises(type(error)):
        cluster._start_client(address)
    assert ray.calls == 1

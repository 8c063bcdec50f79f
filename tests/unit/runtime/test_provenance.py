"""Where a result came from: the commit, the CPU and the record a reproduction writes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nopelab.runtime import provenance


def test_commit_is_the_checkouts_head() -> None:
    source = Path(provenance.__file__).parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("nopelab is not running from a git checkout")
    assert provenance.commit() in (head.stdout.strip(), head.stdout.strip() + "-dirty")


def test_commit_outside_a_checkout_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_git(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert provenance.commit() is None


def test_record_holds_the_command_time_and_machine() -> None:
    begun = provenance.start()
    assert begun["commit"] == provenance.commit()
    run = provenance.record("nopelab reproduce x", begun, 12.34)
    assert run["command"] == "nopelab reproduce x" and run["seconds"] == 12.3
    assert run["started"] == begun["started"] and run["commit"] == begun["commit"]
    assert run["cores"] >= 1 and run["nopelab"]
    assert set(run) >= {"commit", "cpu", "torch", "python", "load_at_end", "started"}
    assert 0 < run["peak_memory_gb"] < 1000  # this test process holds torch: tens of MB at least

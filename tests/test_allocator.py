"""keep_freed_memory: reused large buffers stop faulting their pages in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import resource, sys, torch
from nopelab.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "kept" else None
def cycle():  # a forward pass's pattern: buffers of tens of MB, allocated and freed
    a = torch.ones(5 << 20)
    del a
    b, c = torch.ones(7 << 20), torch.ones(7 << 20)
    del b, c
for _ in range(2):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    cycle()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_kept_memory_faults_far_less_on_reuse() -> None:
    applied, kept = page_faults("kept")
    _, default = page_faults("default")
    assert applied == "True"
    assert kept < default / 2, (kept, default)

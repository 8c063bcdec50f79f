"""keep_freed_memory: a large block is served from the heap and stays there after free.

Read from glibc's own bookkeeping (mallinfo2), in a fresh process per setting, since page-fault
counts also move with the kernel's memory reclaim.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import ctypes, ctypes.util, sys
from nopelab.runtime.allocator import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split())]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
applied = keep_freed_memory() if sys.argv[1] == "kept" else None
block = libc.malloc(20 << 20)  # an activation buffer's size
mmapped = libc.mallinfo2().hblkhd
libc.free(block)
print(applied, mmapped, libc.mallinfo2().arena)
"""
MB = 1 << 20


def malloc_state(mode: str) -> tuple[str, int, int]:
    applied, mmapped, heap = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return applied, int(mmapped), int(heap)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_freed_block_stays_in_the_heap_only_when_kept() -> None:
    applied, mmapped, heap = malloc_state("kept")
    assert applied == "True"
    assert mmapped < 20 * MB and heap >= 20 * MB  # from the heap, not trimmed after free
    _, mmapped, heap = malloc_state("default")
    assert mmapped >= 20 * MB and heap < 20 * MB  # glibc's default: mmap, returned on free

"""``import minigrad`` keeps freed memory for reuse (glibc), unless MINIGRAD_MALLOC=default."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from minigrad.backend.allocator import tune_malloc

PROBE = """
import os, numpy as np
import minigrad
page = os.sysconf("SC_PAGE_SIZE")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
a = np.ones(24 << 20, np.uint8)  # 24 MB: above glibc's dynamic mmap threshold, below ours
before_free = rss()
del a
print(before_free - rss())  # bytes handed back to the kernel by the free
"""


def _returned_bytes(setting: str) -> int:
    env = dict(os.environ, MINIGRAD_MALLOC=setting)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not (sys.platform.startswith("linux") and os.path.exists("/proc/self/statm")),
                    reason="glibc/Linux allocator behaviour")
def test_freed_arrays_stay_in_the_process_unless_disabled():
    if not tune_malloc():
        pytest.skip("this C library has no mallopt")
    assert _returned_bytes("default") >= 20 << 20  # glibc mmaps it and unmaps it on free
    assert _returned_bytes("tuned") < 4 << 20  # kept on the heap for the next temporary

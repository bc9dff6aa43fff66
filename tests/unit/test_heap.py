"""A process that starts the client loop (or a storage node) serves large buffers from its heap (protos/heap.py).

Each case runs in a fresh interpreter, since glibc's thresholds are process-wide and move with what the
process has freed. glibc reports how many chunks it has mapped on their own (mallinfo2's hblks): a fresh
process maps a 16 MiB allocation (its threshold starts at 128 KiB and follows the chunks freed, which an import
leaves far below that); one that keeps large buffers on the heap (a 32 MiB threshold) does not.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

PROBE = """
import ctypes, ctypes.util, sys
libc = ctypes.CDLL(ctypes.util.find_library("c"))

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]

libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
{setup}
before = libc.mallinfo2().hblks
block = libc.malloc(16 << 20)
mapped = libc.mallinfo2().hblks - before
libc.free(block)
print(mapped)
"""


def _mapped_chunks(setup: str, **env: str) -> int:
    """How many chunks a 16 MiB malloc mapped on its own in a fresh process after `setup`."""
    run = subprocess.run([sys.executable, "-c", PROBE.format(setup=setup)], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={**os.environ, **env})
    assert run.returncode == 0, run.stderr
    return int(run.stdout.split()[-1])


def _on_glibc() -> bool:
    try:
        return sys.platform.startswith("linux") and bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        return False


pytestmark = pytest.mark.skipif(not _on_glibc(), reason="glibc's mallopt and mallinfo2")


def test_a_fresh_process_maps_a_large_buffer_on_its_own():
    """The probe's baseline: without the setting, glibc maps the buffer (so the other cases can fail)."""
    assert _mapped_chunks("") == 1


def test_keep_large_buffers_on_heap_serves_them_from_the_heap():
    setup = "from protos.heap import keep_large_buffers_on_heap\nassert keep_large_buffers_on_heap()"
    assert _mapped_chunks(setup) == 0


def test_the_client_loop_keeps_large_buffers_on_heap():
    """The writer's joined messages and the reader's ReadRange messages come from the heap once the process's
    client loop runs."""
    setup = "from connector.client.runner.runtime import Runtime\nRuntime.shared()"
    assert _mapped_chunks(setup, LEDGER_CLIENT_HEAP_TUNING="") == 0


@pytest.mark.parametrize("off", ["off", "0", "False", " no "])
def test_the_client_leaves_glibc_alone_when_told_to(off):
    setup = "from connector.client.runner.runtime import Runtime\nRuntime.shared()"
    assert _mapped_chunks(setup, LEDGER_CLIENT_HEAP_TUNING=off) == 1

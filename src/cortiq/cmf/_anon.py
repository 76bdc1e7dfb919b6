"""Preload: a file's bytes copied into private anonymous memory, huge pages where offered.

Decode streams every weight from memory each token; from a file mapping that memory
is 4 KiB page-cache pages, one TLB miss each. A private anonymous copy advised with
MADV_HUGEPAGE (Linux, THP mode `always` or `madvise`) is backed by 2 MiB pages instead.
The copy starts on a 2 MiB boundary inside an over-allocated map, because huge pages
only back whole aligned 2 MiB ranges. Elsewhere (macOS, Windows) the copy is plain
anonymous memory.

`worth_preloading` is the default's rule: copy a file when the copy gets huge pages
(on Linux with THP offered; elsewhere the copy is the same 4 KiB pages as the map and
only doubles the memory) and the file takes at most half the available memory (the
copy and the page cache it is read through both hold it for a while).
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from .errors import BoundsError

HUGE_PAGE = 2 << 20
CHUNK = 64 << 20
THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
MEMINFO = "/proc/meminfo"


def huge_pages_offered(mode_file: str = THP_MODE) -> bool:
    """Whether an anonymous map advised with MADV_HUGEPAGE gets 2 MiB pages here: the
    kernel's THP mode (the bracketed word of `mode_file`) is `always` or `madvise`."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open(mode_file) as fh:
            text = fh.read()
    except OSError:
        return False
    mode = text[text.find("[") + 1:text.find("]")] if "[" in text else ""
    return mode in ("always", "madvise")


def available_memory(meminfo: str = MEMINFO) -> int | None:
    """MemAvailable of `meminfo` in bytes (None where there is no such file)."""
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def worth_preloading(path, mode_file: str = THP_MODE, meminfo: str = MEMINFO) -> bool:
    """The default preload decision for the model file at `path` (see the module
    docstring); False for anything that is not a readable file."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return False
    avail = available_memory(meminfo)
    return (os.path.isfile(path) and avail is not None and size <= avail // 2
            and huge_pages_offered(mode_file))


def anon_copy(fh, size: int, path: str):
    """Copy the first `size` bytes of the binary file `fh` (read from its current
    position) into fresh anonymous memory. Returns `(buf, mm)`: `buf` a read-only
    uint8 array of `size` bytes starting on a 2 MiB boundary, `mm` the map to close()
    once `buf` and its views are gone. BoundsError if the file ends early (it shrank
    after its size was taken)."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    # Python's default for fd -1 is MAP_SHARED (shmem), which gets no huge pages.
    mm = mmap.mmap(-1, size + HUGE_PAGE, **({"flags": flags} if flags else {}))
    try:
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                mm.madvise(mmap.MADV_HUGEPAGE)  # before the first touch
            except OSError:  # a kernel without THP: plain pages
                pass
        whole = np.frombuffer(mm, dtype=np.uint8)
        start = -whole.ctypes.data % HUGE_PAGE
        del whole
        view = memoryview(mm)[start:start + size]
        try:
            pos = 0
            while pos < size:
                n = fh.readinto(view[pos:pos + CHUNK])
                if not n:
                    raise BoundsError(f"{path}: file shrank while being preloaded: it ended "
                                      f"at {pos} bytes, {size} were expected")
                pos += n
            # a read-only export: numpy cannot make it writeable again
            return np.frombuffer(view.toreadonly(), dtype=np.uint8), mm
        finally:
            view.release()
    except BaseException:
        try:
            mm.close()
        except BufferError:
            pass
        raise

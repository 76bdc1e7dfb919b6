"""Array helpers shared by the kernel tests."""
import zlib

import numpy as np


def misaligned(a):
    """A copy of `a` (any dtype) whose data pointer is 4 bytes off a 32-byte boundary,
    so SIMD kernels meet unaligned loads."""
    a = np.ascontiguousarray(a)
    buf = np.empty(a.nbytes + 64, np.uint8)
    off = (-buf.ctypes.data) % 32 + 4
    out = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % 32 != 0
    return out


def stable_seed(*parts) -> int:
    """A 32-bit seed from `parts` (strings, numbers, tuples) that is the same in every
    process: `hash()` of a str is randomised per process (PYTHONHASHSEED), so a failure
    seeded by it would not reproduce."""
    return zlib.crc32(repr(parts).encode("utf-8"))

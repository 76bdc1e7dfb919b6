"""Array helpers shared by the kernel tests."""
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

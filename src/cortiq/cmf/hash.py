"""hash64 (docs/cmf-format.md §6.1): the numpy reference and the fast C path.

    fmix(x)  = x ^= x>>33; x *= 0xFF51AFD7ED558CCD; x ^= x>>33; x *= 0xC4CEB9FE1A85EC53; x ^= x>>33
    acc      = XOR over i of fmix(w_i) ^ (i * 0x9E3779B97F4A7C15)   (w_i = little-endian u64
               word i; the last partial word is zero-padded)
    hash64   = fmix(acc ^ n)

`hash64` uses the C kernel (csrc/hash, GIL released); `hash64_numpy` is the readable
reference the tests compare it with. Both return a Python int; `hex16` formats the
16-lowercase-hex-digit strings of `section_hashes`.
"""
from __future__ import annotations

import numpy as np

M1 = np.uint64(0xFF51AFD7ED558CCD)
M2 = np.uint64(0xC4CEB9FE1A85EC53)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S33 = np.uint64(33)
_CHUNK_WORDS = 1 << 20  # the numpy reference works in 8 MiB slices to bound memory


def _fmix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> _S33)
    x = x * M1
    x = x ^ (x >> _S33)
    x = x * M2
    return x ^ (x >> _S33)


def hash64_numpy(data) -> int:
    """Reference hash64 in numpy (uint64 arithmetic wraps mod 2**64)."""
    b = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    n = b.size
    nw = n // 8
    acc = np.uint64(0)
    with np.errstate(over="ignore"):
        for start in range(0, nw, _CHUNK_WORDS):
            stop = min(nw, start + _CHUNK_WORDS)
            w = b[8 * start:8 * stop].view("<u8").astype(np.uint64)
            idx = np.arange(start, stop, dtype=np.uint64) * GOLDEN
            acc ^= np.bitwise_xor.reduce(_fmix(w) ^ idx)
        if n % 8:
            last = np.zeros(8, np.uint8)
            last[:n % 8] = b[8 * nw:]
            w = last.view("<u8").astype(np.uint64)
            acc ^= (_fmix(w) ^ (np.uint64(nw) * GOLDEN))[0]
        return int(_fmix(np.array([acc ^ np.uint64(n)], np.uint64))[0])


def hash64(data) -> int:
    """hash64 of a bytes-like object via the active C kernel table."""
    from ..kernels._kernels import hash64 as _c_hash64
    return _c_hash64(data)


def hex16(h: int) -> str:
    """The 16-lowercase-hex-digit form used in `section_hashes`."""
    return f"{h:016x}"

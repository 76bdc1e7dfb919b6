"""NumPy decoders of the ggml block formats (docs/cmf-format.md §7.9).

Each returns float32 weights equal, bit for bit, to what the ``gguf`` package's
dequantizers give: the same float32 operations in the same order (e.g. Q4_K's
``(d * sc) * q - (dmin * m)``, every product rounded to float32, never fused). They
decode whole blocks, so a payload is ``n_blocks * block_bytes`` bytes; the caller checks
the size. This is the reference the C decoder (csrc/matvec/ggml_*_scalar.h) is tested
against, and what reads a format the kernels do not multiply.
"""
from __future__ import annotations

import numpy as np

from .ggml_blocks import FORMATS

#: iq4_nl's and iq4_xs's 16 levels, indexed by the 4-bit code
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      np.float32)


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian f16 bytes [n, 2] -> float32 [n, 1]."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32).reshape(-1, 1)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16k] bytes -> [n, 32k] codes: per 16 bytes, the low nibbles then the high ones."""
    n, w = qs.shape
    q = qs.reshape(n, w // 16, 1, 16)
    return np.concatenate([q & 15, q >> 4], axis=2).reshape(n, 2 * w)


def _bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Little-endian bit k of each row of qh as uint8, k < count."""
    return np.unpackbits(np.ascontiguousarray(qh), axis=1, bitorder="little")[:, :count]


def _q4_0(b):
    return _f16(b[:, :2]) * (_nibbles(b[:, 2:]).astype(np.float32) - np.float32(8))


def _q4_1(b):
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]).astype(np.float32) + _f16(b[:, 2:4])


def _q5(b, with_min: bool):
    at = 4 if with_min else 2
    q = _nibbles(b[:, at + 4:]) | (_bits(b[:, at:at + 4], 32) << 4)
    if with_min:
        return _f16(b[:, :2]) * q.astype(np.float32) + _f16(b[:, 2:4])
    return _f16(b[:, :2]) * (q.astype(np.float32) - np.float32(16))


def _q8_0(b):
    return _f16(b[:, :2]) * np.ascontiguousarray(b[:, 2:]).view(np.int8).astype(np.float32)


def _iq4_nl(b):
    return _f16(b[:, :2]) * IQ4_LEVELS[_nibbles(b[:, 2:])]


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 scale bytes -> 8 six-bit scales and 8 six-bit mins (float32):
    sub-block j < 4 takes the low 6 bits of bytes j and 4 + j; j >= 4 takes a nibble of
    byte 4 + j and the top two bits of bytes j - 4 and j."""
    a, b, c = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(b):
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    d = _f16(b[:, :2]) * sc                 # [n, 8]
    dm = _f16(b[:, 2:4]) * mn
    # 32 bytes a pair of sub-blocks: low nibbles sub-block 2i, high ones 2i + 1
    q = b[:, 16:].reshape(n, 4, 1, 32)
    q = np.concatenate([q & 15, q >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
    return (d[:, :, None] * q - dm[:, :, None]).reshape(n, 256)


def _q5_k(b):
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    d = _f16(b[:, :2]) * sc
    dm = _f16(b[:, 2:4]) * mn
    lo = b[:, 48:].reshape(n, 4, 1, 32)
    lo = np.concatenate([lo & 15, lo >> 4], axis=2).reshape(n, 8, 32)
    # bit j of qh byte k is the fifth bit of weight k of sub-block j
    hi = ((b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1)
    q = (lo | (hi << 4)).astype(np.float32)
    return (d[:, :, None] * q - dm[:, :, None]).reshape(n, 256)


def _q6_k(b):
    n = b.shape[0]
    ql, qh = b[:, :128].reshape(n, 2, 1, 64), b[:, 128:192].reshape(n, 2, 1, 32)
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210]) * sc            # [n, 16]: one scale per 16 weights
    # per half of 128: 64 low nibbles then 64 high ones; qh's 32 bytes give two bits
    # to each of four runs of 32
    lo = np.concatenate([ql & 15, ql >> 4], axis=2).reshape(n, 2, 4, 32)
    hi = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    q = ((lo | (hi << 4)).astype(np.int16) - 32).astype(np.float32).reshape(n, 16, 16)
    return (d[:, :, None] * q).reshape(n, 256)


def _q2_k(b):
    n = b.shape[0]
    s = b[:, :16]
    dl = _f16(b[:, 80:82]) * (s & 15).astype(np.float32)     # [n, 16]
    ml = _f16(b[:, 82:84]) * (s >> 4).astype(np.float32)
    # per 32 code bytes: four 2-bit planes, each 32 weights
    q = (b[:, 16:80].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    q = q.reshape(n, 16, 16).astype(np.float32)
    return (dl[:, :, None] * q - ml[:, :, None]).reshape(n, 256)


def _q3_k(b):
    n = b.shape[0]
    hmask, qs, s = b[:, :32], b[:, 32:96], b[:, 96:108]
    low = np.concatenate([s[:, :8] & 15, s[:, :8] >> 4], axis=1)                # [n, 16]
    high = (s[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)) & 3
    sc = (low | (high.reshape(n, 16) << 4)).astype(np.int16) - 32
    dl = _f16(b[:, 108:110]) * sc.astype(np.float32)                              # [n, 16]
    lo = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    # hmask bit j of byte k: weight k of run j; a clear bit subtracts 4
    hm = (hmask.reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = lo.reshape(n, 8, 32).astype(np.int16) - 4 * (1 - hm.astype(np.int16))
    return (dl[:, :, None] * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


def _iq4_xs(b):
    n = b.shape[0]
    sh = np.ascontiguousarray(b[:, 2:4]).view("<u2").astype(np.uint32).reshape(n, 1)
    sl = b[:, 4:8]
    low = np.stack([sl & 15, sl >> 4], axis=2).reshape(n, 8)
    high = (sh >> (2 * np.arange(8, dtype=np.uint32)).reshape(1, 8)) & 3
    sc = (low.astype(np.int16) | (high.astype(np.int16) << 4)) - 32
    dl = _f16(b[:, :2]) * sc.astype(np.float32)                                   # [n, 8]
    return (dl[:, :, None] * IQ4_LEVELS[_nibbles(b[:, 8:]).reshape(n, 8, 32)]).reshape(n, 256)


_DECODERS = {
    "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": lambda b: _q5(b, False), "q5_1": lambda b: _q5(b, True),
    "q8_0": _q8_0, "q2_k": _q2_k, "q3_k": _q3_k, "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k,
    "iq4_nl": _iq4_nl, "iq4_xs": _iq4_xs,
}


def dequantize(buf: np.ndarray, dtype: str, n: int) -> np.ndarray:
    """The first n weights (n a multiple of the block size) of ggml payload bytes."""
    f = FORMATS[dtype]
    blocks = np.ascontiguousarray(buf[:n // f.block_elems * f.block_bytes]).reshape(-1, f.block_bytes)
    with np.errstate(invalid="ignore", over="ignore"):
        return _DECODERS[dtype](blocks).astype(np.float32, copy=False).reshape(n)

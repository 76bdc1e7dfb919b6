"""Split-attention records as the GPU's split attention kernels write them, for the
tests of the products that merge them."""
import numpy as np


def split_records(rng, nh, hd, splits):
    """Per-(head, split) softmax partials [m, l, 0, 0, acc] as a split attention writes
    them (the last split empty: m = -3e38, l = 0) and the merged heads they stand for:
    (records as one row, merged heads as one vector)."""
    m = rng.standard_normal((nh, splits)).astype(np.float32) * 3
    den = rng.random((nh, splits)).astype(np.float32) * 5 + 0.1
    acc = rng.standard_normal((nh, splits, hd)).astype(np.float32) * 4
    if splits > 1:
        m[:, -1], den[:, -1], acc[:, -1] = -3e38, 0.0, 0.0
    rec = np.zeros((nh, splits, hd + 4), np.float32)
    rec[..., 0], rec[..., 1], rec[..., 4:] = m, den, acc
    e = np.exp(m.astype(np.float64) - m.max(1, keepdims=True))
    y = (e[..., None] * acc).sum(1) / (e * den).sum(1)[:, None]
    return rec.reshape(1, -1), y.ravel().astype(np.float32)

"""Byte vectors from outside the code under test for q4tp, q2tp, vbit and vbit_ro.

* ``tests/data/quant_vectors.json``: small tensors worked out by hand from
  docs/cmf-format.md §7.6 and §7.8 (``tests/data/make_quant_vectors.py`` lists each
  decision and packs the bytes with the standard library): zero tiles and rows, the
  2^-14 scale floor, rounding ties, the largest codes, codes straddling bytes, the three
  vbit widths the writer's rule picks. The writer must produce the bytes from the inputs;
  every reader must decode the bytes to the listed values.

Readers: ``cortiq.cmf.quant.dequantize``, the C kernels through ``QTensor`` on every
kernel table (row decode and matmat against the identity), and ``reference.cmf_spec``.
"""
import json
import os

import numpy as np
import pytest

from cortiq.cmf import quant as Q
from cortiq.kernels.tensor import QTensor
from reference import cmf_spec

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
with open(os.path.join(DATA, "quant_vectors.json")) as fh:
    VECTORS = json.load(fh)["vectors"]
IDS = [f"{v['dtype']}-{'x'.join(map(str, v['shape']))}" for v in VECTORS]
ENCODED = [v for v in VECTORS if v["encode"]]     # the others: payloads no writer emits


def _readers(raw: np.ndarray, dtype: str, shape):
    """(name, decoded float32) from each reader."""
    yield "quant.dequantize", Q.dequantize(raw, dtype, shape)
    yield "cmf_spec.decode", cmf_spec.decode(raw.tobytes(), dtype, shape)
    q = QTensor(raw, dtype, shape)
    yield "QTensor.dequantize", q.dequantize()
    yield "QTensor.matmat(I)", q.matmat(np.eye(shape[1], dtype=np.float32)).T


@pytest.mark.parametrize("vec", ENCODED, ids=[i for i, v in zip(IDS, VECTORS) if v["encode"]])
def test_hand_vectors_encode(vec):
    w = np.array(vec["input"], np.float32)
    got = Q.quantize(w, vec["dtype"])
    assert got.tobytes().hex() == vec["bytes"]


@pytest.mark.parametrize("vec", VECTORS, ids=IDS)
def test_hand_vectors_decode(isa, vec):
    raw = np.frombuffer(bytes.fromhex(vec["bytes"]), np.uint8)
    want = np.array(vec["decoded"], np.float32)
    for name, got in _readers(raw, vec["dtype"], tuple(vec["shape"])):
        np.testing.assert_array_equal(got, want, err_msg=name)


"""hash64 (docs/cmf-format.md §6.1): the spec's test vectors, the C kernel of every usable ISA
against the numpy reference (exact: it is an integer function), every tail length and
misaligned starts."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortiq.kernels import _kernels as K
from cortiq.cmf.hash import hash64, hash64_numpy, hex16

VECTORS = [
    (b"", 0x0000000000000000),
    (b"a", 0x247F1EAECB8BE39A),
    (bytes(range(8)), 0x3A9E0C13529C4F9B),
    (bytes(range(17)), 0x38069FBB2DE94428),
    (b"CMF", 0xB59AA39A074033EC),
    (b"0123456789abcdef", 0x30D401310062EA9F),
    (bytes(range(256)), 0x9955BB876C0706BF),
]


@pytest.mark.parametrize("data,want", VECTORS)
def test_spec_vectors(isa, data, want):
    assert hash64(data) == want
    assert hash64_numpy(data) == want
    assert hex16(want) == f"{want:016x}" and len(hex16(want)) == 16


@pytest.mark.parametrize("n", list(range(80)) + [255, 256, 257, 1023, 4099, 65537])
def test_every_length_and_alignment(isa, n):
    rng = np.random.default_rng(n)
    buf = rng.integers(0, 256, n + 8, dtype=np.uint8)
    for start in (0, 1, 3, 7):
        view = buf[start:start + n]
        assert hash64(view) == hash64_numpy(view), (n, start)


def test_input_types(isa):
    data = bytes(range(100))
    h = hash64_numpy(data)
    assert hash64(bytearray(data)) == h
    assert hash64(memoryview(data)) == h
    assert hash64(np.frombuffer(data, np.uint8)) == h
    assert hash64(np.frombuffer(data[:96], np.float32)) == hash64_numpy(data[:96])
    with pytest.raises(TypeError, match="hash64"):
        hash64(12)
    with pytest.raises(ValueError, match="contiguous"):
        hash64(np.arange(20, dtype=np.uint8)[::2])


@given(st.binary(max_size=3000))
def test_c_matches_numpy(isas, data):
    want = hash64_numpy(data)
    for name in isas:
        before = K.active_isa()
        K.set_isa(name)
        try:
            assert hash64(data) == want
        finally:
            K.set_isa(before)


def test_large_buffer_crosses_numpy_chunks():
    buf = np.random.default_rng(1).integers(0, 256, (1 << 23) + 13, dtype=np.uint8)
    assert hash64(buf) == hash64_numpy(buf)

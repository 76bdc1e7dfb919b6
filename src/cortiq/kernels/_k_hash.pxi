# hash: hash64 of docs/cmf-format.md §6.1 (csrc/hash).

def hash64(data):
    """hash64 of a bytes-like object (bytes, bytearray, memoryview, contiguous numpy array).

    Returns a Python int in [0, 2**64). The GIL is released while hashing."""
    cdef const uint8_t[::1] view
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"hash64: data must be bytes-like, got {type(data).__name__}") from None
    if not mv.c_contiguous:
        raise ValueError("hash64: data must be C-contiguous")
    mv = mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv
    cdef size_t n = mv.nbytes
    cdef uint64_t h
    if n == 0:
        return 0
    view = mv
    cdef const uint8_t *p = &view[0]
    with nogil:
        h = cq_active().hash.hash64(p, n)
    return h

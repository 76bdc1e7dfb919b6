"""A strict reader of the GGUF container (llama.cpp's model file), versions 2 and 3.

``parse(buf, path)`` reads the header, the key/value metadata and the tensor
directory of a little-endian GGUF file from a uint8 buffer (an mmap view) and checks
every count, length, type and offset against the buffer before using it: a damaged or
truncated file raises `FormatError` naming the key or tensor and the byte offset,
never an IndexError or a numpy error. Tensor payloads are not read; their ranges are
checked to lie inside the file, aligned.

Layout (all little-endian): magic ``GGUF``, u32 version, u64 tensor count, u64 key
count; per key: string name, u32 value type, value; per tensor: string name, u32
n_dims (<= 4), u64 dims (ne, fastest first), u32 ggml type, u64 offset relative to the
data section; padding to ``general.alignment`` (default 32); the data section.
A string is a u64 byte length and UTF-8 bytes; an array a u32 element type, a u64
count and the elements.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..errors import FormatError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4

#: metadata value type -> (name, numpy dtype) for the fixed-size scalars
SCALAR_TYPES = {0: ("UINT8", "<u1"), 1: ("INT8", "<i1"), 2: ("UINT16", "<u2"),
                3: ("INT16", "<i2"), 4: ("UINT32", "<u4"), 5: ("INT32", "<i4"),
                6: ("FLOAT32", "<f4"), 7: ("BOOL", "<u1"), 10: ("UINT64", "<u8"),
                11: ("INT64", "<i8"), 12: ("FLOAT64", "<f8")}
STRING, ARRAY, BOOL = 8, 9, 7


@dataclass(frozen=True)
class GgmlType:
    name: str          #: ggml's name (GGMLQuantizationType)
    number: int        #: ggml's type number
    block_elems: int   #: values per block (1 for plain numbers)
    block_bytes: int   #: bytes per block

    def nbytes(self, count: int) -> int:
        return count // self.block_elems * self.block_bytes


#: ggml type number -> layout: every type a GGUF file may hold
GGML_TYPES: dict[int, GgmlType] = {t.number: t for t in (
    GgmlType("F32", 0, 1, 4), GgmlType("F16", 1, 1, 2), GgmlType("Q4_0", 2, 32, 18),
    GgmlType("Q4_1", 3, 32, 20), GgmlType("Q5_0", 6, 32, 22), GgmlType("Q5_1", 7, 32, 24),
    GgmlType("Q8_0", 8, 32, 34), GgmlType("Q8_1", 9, 32, 40), GgmlType("Q2_K", 10, 256, 84),
    GgmlType("Q3_K", 11, 256, 110), GgmlType("Q4_K", 12, 256, 144),
    GgmlType("Q5_K", 13, 256, 176), GgmlType("Q6_K", 14, 256, 210),
    GgmlType("Q8_K", 15, 256, 292), GgmlType("IQ2_XXS", 16, 256, 66),
    GgmlType("IQ2_XS", 17, 256, 74), GgmlType("IQ3_XXS", 18, 256, 98),
    GgmlType("IQ1_S", 19, 256, 50), GgmlType("IQ4_NL", 20, 32, 18),
    GgmlType("IQ3_S", 21, 256, 110), GgmlType("IQ2_S", 22, 256, 82),
    GgmlType("IQ4_XS", 23, 256, 136), GgmlType("I8", 24, 1, 1), GgmlType("I16", 25, 1, 2),
    GgmlType("I32", 26, 1, 4), GgmlType("I64", 27, 1, 8), GgmlType("F64", 28, 1, 8),
    GgmlType("IQ1_M", 29, 256, 56), GgmlType("BF16", 30, 1, 2),
    GgmlType("TQ1_0", 34, 256, 54), GgmlType("TQ2_0", 35, 256, 66),
    GgmlType("MXFP4", 39, 32, 17))}


@dataclass(frozen=True)
class GgufTensor:
    """One tensor directory entry. `offset` is absolute in the file."""
    name: str
    type: GgmlType
    ne: tuple          #: ggml dims, fastest-varying first
    offset: int
    nbytes: int

    @property
    def shape(self) -> tuple:
        """Row-major shape (ne reversed): a matrix is [rows, cols]."""
        return tuple(reversed(self.ne))


@dataclass
class GgufLayout:
    version: int
    metadata: dict          #: key -> Python value (lists for arrays, numpy for numbers)
    key_spans: dict         #: key -> (offset, length) of its value bytes
    tensors: dict           #: name -> GgufTensor, in file order
    alignment: int
    data_offset: int


class _Cursor:
    """Reads little-endian values from `buf`, refusing any read past its end."""

    def __init__(self, buf: np.ndarray, path: str):
        self.buf, self.path, self.pos, self.size = buf, path, 0, int(buf.size)

    def fail(self, what: str, at: int | None = None) -> FormatError:
        return FormatError(f"{self.path}: GGUF {what} (at byte offset "
                           f"{self.pos if at is None else at})")

    def take(self, n: int, what: str) -> np.ndarray:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what}: needs {n} bytes but the file ends at {self.size}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self, what: str) -> int:
        return int(struct.unpack("<I", self.take(4, what).tobytes())[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack("<Q", self.take(8, what).tobytes())[0])

    def string(self, what: str) -> str:
        at = self.pos
        n = self.u64(f"{what}: string length")
        if n > self.size - self.pos:
            raise self.fail(f"{what}: string length {n} runs past the end of the file "
                            f"({self.size} bytes)", at)
        raw = self.take(n, what).tobytes()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what}: string is not UTF-8", at) from None

    def value(self, vtype: int, what: str):
        if vtype in SCALAR_TYPES:
            dt = np.dtype(SCALAR_TYPES[vtype][1])
            v = np.frombuffer(self.take(dt.itemsize, what).tobytes(), dt)[0].item()
            return bool(v) if vtype == BOOL else v
        if vtype == STRING:
            return self.string(what)
        if vtype == ARRAY:
            return self.array(what)
        raise self.fail(f"{what}: unknown value type {vtype}", self.pos - 4)

    def array(self, what: str):
        at = self.pos
        etype = self.u32(f"{what}: array element type")
        count = self.u64(f"{what}: array length")
        if etype in SCALAR_TYPES:
            dt = np.dtype(SCALAR_TYPES[etype][1])
            if count > (self.size - self.pos) // dt.itemsize:
                raise self.fail(f"{what}: array of {count} {SCALAR_TYPES[etype][0]} runs "
                                f"past the end of the file ({self.size} bytes)", at)
            a = np.frombuffer(self.take(count * dt.itemsize, what).tobytes(), dt)
            return [bool(x) for x in a] if etype == BOOL else a.tolist()
        if etype == STRING:
            if count > (self.size - self.pos) // 8:       # each string takes >= 8 bytes
                raise self.fail(f"{what}: array of {count} strings runs past the end of "
                                f"the file ({self.size} bytes)", at)
            return [self.string(f"{what}[{i}]") for i in range(count)]
        if etype == ARRAY:
            if count > (self.size - self.pos) // 12:      # each array takes >= 12 bytes
                raise self.fail(f"{what}: array of {count} arrays runs past the end of "
                                f"the file ({self.size} bytes)", at)
            return [self.array(f"{what}[{i}]") for i in range(count)]
        raise self.fail(f"{what}: unknown array element type {etype}", at)


def parse(buf: np.ndarray, path: str) -> GgufLayout:
    """The metadata and tensor directory of the GGUF bytes `buf` (see the module
    docstring); FormatError naming the problem and its byte offset."""
    c = _Cursor(buf, path)
    magic = c.take(4, "magic").tobytes() if c.size >= 4 else None
    if magic != MAGIC:
        raise FormatError(f"{path}: bad magic {magic!r} at offset 0 (a GGUF file starts "
                          f"with {MAGIC!r})")
    version = c.u32("header: version")
    if version not in VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        hint = " (a big-endian file: cortiq reads little-endian GGUF)" \
            if swapped in VERSIONS else ""
        raise FormatError(f"{path}: GGUF version {version} at offset 4{hint}; cortiq reads "
                          f"versions {', '.join(map(str, VERSIONS))}")
    n_tensors = c.u64("header: tensor count")
    n_keys = c.u64("header: metadata key count")
    # every key takes >= 12 bytes, every tensor entry >= 28: refuse absurd counts early
    if n_keys > c.size // 12:
        raise c.fail(f"header: metadata key count {n_keys} cannot fit in a "
                     f"{c.size}-byte file", 16)
    if n_tensors > c.size // 28:
        raise c.fail(f"header: tensor count {n_tensors} cannot fit in a {c.size}-byte "
                     "file", 8)
    meta: dict = {}
    spans: dict = {}
    for i in range(n_keys):
        at = c.pos
        key = c.string(f"metadata key {i}")
        if key in meta:
            raise c.fail(f"metadata key {key!r}: appears twice", at)
        vtype = c.u32(f"metadata {key}: value type")
        start = c.pos
        meta[key] = c.value(vtype, f"metadata {key}")
        spans[key] = (start, c.pos - start)
    alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if (isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1
            or alignment & (alignment - 1)):
        raise c.fail(f"metadata general.alignment: {alignment!r} is not a power of two",
                     spans["general.alignment"][0])
    entries = []
    for i in range(n_tensors):
        at = c.pos
        name = c.string(f"tensor {i}: name")
        n_dims = c.u32(f"tensor {name}: n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise c.fail(f"tensor {name}: n_dims {n_dims} (ggml has 1 to {MAX_DIMS})",
                         c.pos - 4)
        ne = tuple(c.u64(f"tensor {name}: dim {d}") for d in range(n_dims))
        tnum = c.u32(f"tensor {name}: type")
        if tnum not in GGML_TYPES:
            raise c.fail(f"tensor {name}: unknown ggml type {tnum}", c.pos - 4)
        off = c.u64(f"tensor {name}: offset")
        entries.append((at, name, ne, GGML_TYPES[tnum], off))
    data_offset = -(-c.pos // alignment) * alignment
    if data_offset > c.size:
        raise c.fail(f"data section starts at {data_offset}, past the end of the file "
                     f"({c.size} bytes)", c.pos)
    tensors: dict = {}
    for at, name, ne, t, off in entries:
        where = f"tensor {name} (directory entry at byte offset {at})"
        if name in tensors:
            raise FormatError(f"{path}: GGUF {where}: duplicate tensor name")
        if off % alignment:
            raise FormatError(f"{path}: GGUF {where}: data offset {off} is not a multiple "
                              f"of the alignment {alignment}")
        count = 1
        for d in ne:
            count *= d
        if ne[0] % t.block_elems:
            raise FormatError(f"{path}: GGUF {where}: {t.name} rows of {ne[0]} values are "
                              f"not whole blocks of {t.block_elems}")
        nbytes = t.nbytes(count)
        start = data_offset + off
        if start + nbytes > c.size:
            raise FormatError(f"{path}: GGUF {where}: {t.name} {list(ne)} payload "
                              f"[{start}, {start + nbytes}) runs past the end of the file "
                              f"({c.size} bytes)")
        tensors[name] = GgufTensor(name, t, ne, start, nbytes)
    return GgufLayout(version, meta, spans, tensors, alignment, data_offset)

"""The safetensors reader every converter uses.

A ``.safetensors`` file is an 8-byte little-endian header length, a JSON header
(``{name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}``) and the tensors'
bytes. ``SafetensorsShard`` memory-maps one file and hands out one tensor at a time:
``raw`` as a bounds-checked view in its storage dtype, ``load`` as a float32 copy.
``open_checkpoint`` maps every tensor name of a Hugging Face directory to its shard.

Its own reader rather than the ``safetensors`` package: numpy has no bfloat16, so
``safetensors.numpy`` cannot read bf16 checkpoints, and the FP8 / FP4 / E8M0 codes of
block-scaled checkpoints are wanted as their stored bytes. A damaged file (short,
bad header, offsets past the end or not matching the shape) raises ``FormatError``.
"""
from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np

from ..errors import FormatError

__all__ = ["FLOAT_DTYPES", "SafetensorsShard", "open_checkpoint"]

_ST_DTYPES: dict[str, np.dtype]
_ST_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"),
              "BF16": np.dtype("<u2")}
#: the float dtypes ``load`` converts to float32
FLOAT_DTYPES = tuple(_ST_DTYPES)
#: every safetensors dtype as the numpy dtype its bytes are viewed as (``raw``)
_RAW_DTYPES: dict[str, np.dtype] = {
    **_ST_DTYPES,
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"), "U64": np.dtype("<u8"), "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"), "U8": np.dtype("u1"), "BOOL": np.dtype("u1"),
    "F8_E4M3": np.dtype("u1"), "F8_E5M2": np.dtype("u1"), "F8_E8M0": np.dtype("u1"),
    "F4": np.dtype("u1")}


class SafetensorsShard:
    """One ``.safetensors`` file, memory-mapped on first use."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise FormatError(f"{self.path}: too short for a safetensors file")
            (n,) = struct.unpack("<Q", head)
            size = self.path.stat().st_size
            if n > size - 8:
                raise FormatError(f"{self.path}: header length {n} runs past the end ({size} B)")
            try:
                self.header = json.loads(f.read(n))
            except ValueError as e:
                raise FormatError(f"{self.path}: bad safetensors header: {e}") from None
        if not isinstance(self.header, dict):
            raise FormatError(f"{self.path}: bad safetensors header: not a JSON object")
        for name, info in self.header.items():
            if name != "__metadata__" and not (isinstance(info, dict) and {
                    "dtype", "shape", "data_offsets"} <= info.keys()):
                raise FormatError(f"{self.path}: bad safetensors header: {name!r} lacks "
                                  f"dtype, shape or data_offsets")
        self._data = 8 + n
        self._size = size
        self.metadata = self.header.pop("__metadata__", None)
        self._mm: mmap.mmap | None = None

    def names(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def dtype(self, name: str) -> str:
        return self.header[name]["dtype"]

    def raw(self, name: str) -> np.ndarray:
        """The stored values as a read-only view of the mapping, in their storage dtype
        (BF16 as uint16; F8_E4M3 / F8_E8M0 as uint8 codes; F4 as uint8 bytes of two codes,
        shape ``[..., last / 2]``), bounds-checked against the file."""
        info = self.header[name]
        code = info["dtype"]
        dt = _RAW_DTYPES.get(code)
        if dt is None:
            raise FormatError(f"{self.path}: {name}: unknown safetensors dtype {code!r}")
        shape = [int(d) for d in info["shape"]]
        if code == "F4":
            if not shape or shape[-1] % 2:
                raise FormatError(f"{self.path}: {name}: F4 shape {shape} has an odd last "
                                  f"dimension (two codes a byte)")
            shape[-1] //= 2
        a, b = info["data_offsets"]
        count = int(np.prod(shape, dtype=np.int64))
        if not 0 <= a <= b or b - a != count * dt.itemsize or self._data + b > self._size:
            raise FormatError(f"{self.path}: {name}: data offsets {a}..{b} do not fit "
                              f"shape {info['shape']} {code}")
        if self._mm is None:
            with open(self.path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(self._mm, dtype=dt, count=count,
                             offset=self._data + a).reshape(shape)

    def load(self, name: str, index=None) -> np.ndarray:
        """A float32 copy of a float tensor (F32, F16, BF16, F64), or of ``raw(name)[index]``
        only: one expert of a stacked ``[E, rows, cols]`` tensor is ``index=(e, slice(lo,
        hi))``, and the rest of the tensor is never converted."""
        code = self.header[name]["dtype"]
        if code not in _ST_DTYPES:
            raise FormatError(f"{self.path}: {name}: dtype {code} is not a float "
                              f"type cortiq converts (F32, F16, BF16, F64)")
        raw = self.raw(name)
        if index is not None:
            raw = raw[index]
        if code == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32)

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a view is still alive (e.g. in a traceback): the
                pass             # mapping closes when the last view goes
            self._mm = None


def open_checkpoint(hf_dir: str | Path) -> dict[str, SafetensorsShard]:
    """``{hf_name: shard}`` over ``model.safetensors.index.json``, ``model.safetensors`` or
    every ``*.safetensors`` in the directory."""
    d = Path(hf_dir)
    index = d / "model.safetensors.index.json"
    if index.exists():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise FormatError(f"{index}: not a safetensors index (no weight_map of file "
                              f"names: {e!r})") from None
    elif (d / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        files = sorted(p.name for p in d.glob("*.safetensors"))
    if not files:
        raise FormatError(f"{d}: no *.safetensors weights found")
    where: dict[str, SafetensorsShard] = {}
    for fname in files:
        if not (d / fname).exists():
            raise FormatError(f"{d / fname}: listed in the index but missing")
        shard = SafetensorsShard(d / fname)
        for name in shard.names():
            if name in where:
                raise FormatError(f"{shard.path}: {name} also in {where[name].path}")
            where[name] = shard
    return where

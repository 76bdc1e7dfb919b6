"""A Llama-family GGUF file opened as a model: what `cortiq.LLM` and the models read
from a `cortiq.cmf.CmfFile`, taken from the GGUF itself.

    gf = cortiq.gguf.open("model.gguf")
    gf.arch["hidden_size"]; gf.tensors["lm_head.weight"].dtype   # "q4_k", "f16", ...
    gf.raw("lm_head.weight")      # uint8 view into the map: exactly the GGUF bytes
    gf.tensor("model.norm.weight")  # float32

Tensors carry HF names (``model.layers.0.self_attn.q_proj.weight``) and row-major
shapes ([rows, cols] for GGUF ne = [cols, rows]). Their dtype is cortiq's name of the
ggml type: ``f32``, ``f16``, ``bf16``, and the ggml block formats by their
`cortiq.cmf.ggml_blocks` names (``q4_k``, ``q8_0``, ...; other ggml types by their
lower-case ggml name). `QTensor.from_cmf` multiplies a dtype its kernels know in place
from the mapped bytes and dequantizes any other once to float32 (through `tensor`).

Llama and Mistral files keep llama.cpp's q/k row order (each head's rotary pairs
interleaved, `llama_meta.PERMUTED`): the arch record says ``rope_interleaved: True``
and `cortiq.models.llama` rotates adjacent pairs (2i, 2i+1) instead of halves. q.k
is the same sum under the same permutation of both, so nothing is copied or re-ordered.

A split GGUF (``name-00001-of-00003.gguf`` ..., `cortiq.gguf.split`) opens from any of
its parts: every part is mapped and checked to belong to the set (the same part count,
each numbered as its name says, no tensor twice, the first part's tensor total), the
metadata comes from the first part, and each tensor is read from the part that holds
it. `path` is then the first part's, `files` every part's.

The files are mapped read-only and never written. GGUF has no hashes: `verify` reports the
structure checks that opening already made (`cortiq.gguf.parser`).
"""
from __future__ import annotations

import builtins
import mmap
import os

import numpy as np

from ..cmf import quant as Q
from ..cmf._anon import anon_copy
from ..cmf.errors import CmfFileNotFound, MissingTensor
from ..cmf.ggml_blocks import BY_GGML_TYPE
from ..cmf.hash import hash64
from ..cmf.reader import TensorDirectory
from ..errors import ConfigError, FormatError
from .llama_meta import (PERMUTED, Meta, architectures, arch_from_gguf, hf_name,
                         tokenizer_from_gguf)
from .parser import GgmlType, GgufLayout, parse
from .split import SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS, part_paths, split_keys

MAGIC = b"GGUF"
VERIFY_MODES = ("lazy", "full", "off")
#: ggml's plain float types -> cortiq dtype
_FLOAT_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


def dtype_of(t: GgmlType) -> str:
    """cortiq's dtype name of a ggml type."""
    if t.name in _FLOAT_DTYPES:
        return _FLOAT_DTYPES[t.name]
    if t.number in BY_GGML_TYPE:
        return BY_GGML_TYPE[t.number].name
    return t.name.lower()


class GgufTensorInfo:
    """One tensor of a GGUF model under its HF name. `offset` is absolute in `file`;
    `hash` is the payload's hash64, computed on first use (GGUF stores none)."""

    __slots__ = ("_buf", "_hash", "dtype", "file", "ggml_type", "gguf_name", "name", "nbytes",
                 "offset", "shape")

    def __init__(self, name, gguf_name, ggml_type: GgmlType, shape, offset, nbytes, file,
                 buf):
        self.name, self.gguf_name, self.ggml_type = name, gguf_name, ggml_type
        self.dtype = dtype_of(ggml_type)
        self.shape, self.offset, self.nbytes, self.file = tuple(shape), offset, nbytes, file
        self._buf = buf
        self._hash: int | None = None

    @property
    def numel(self) -> int:
        return Q.numel(self.shape)

    @property
    def hash(self) -> int:
        if self._hash is None:
            self._hash = int(hash64(self._buf[self.offset:self.offset + self.nbytes]))
        return self._hash

    def __repr__(self):
        return (f"GgufTensorInfo({self.name!r} <- {self.gguf_name!r}, {self.dtype} "
                f"{self.shape}, {self.nbytes} bytes at {self.offset})")


def dequantize(raw: np.ndarray, t: GgmlType, shape, where: str) -> np.ndarray:
    """float32 values of a GGUF payload. The float types and the layouts cortiq's own
    reference knows are decoded here; any other ggml type through the ``gguf``
    package's reference decoder (the ``gguf`` extra)."""
    shape = tuple(int(d) for d in shape)
    dtype = dtype_of(t)
    if dtype == "f32":
        return raw.view("<f4").reshape(shape).astype(np.float32)
    if dtype == "f16":
        return raw.view("<f2").reshape(shape).astype(np.float32)
    if dtype == "bf16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype in Q.DTYPES:
        return Q.dequantize(raw, dtype, shape)
    try:
        import gguf
    except ImportError:
        raise ConfigError(f"{where}: decoding {t.name} needs the 'gguf' package (pip install "
                          "'cortiq[gguf]')") from None
    rows = raw.reshape(-1, t.nbytes(shape[-1]) if shape else raw.size)
    with np.errstate(all="ignore"):       # garbage scales may decode to inf/nan
        out = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(t.number))
    return np.ascontiguousarray(out, np.float32).reshape(shape)


def magic_format(head: bytes) -> str | None:
    """"cmf" or "gguf" for a model file whose first bytes are `head`; None for neither
    (the one place both magics are compared)."""
    from ..cmf.reader import MAGIC as CMF_MAGIC
    if head.startswith(CMF_MAGIC):
        return "cmf"
    if head.startswith(MAGIC):
        return "gguf"
    return None


def is_gguf(path) -> bool:
    """Whether the file at `path` starts with the GGUF magic."""
    try:
        with builtins.open(os.fspath(path), "rb") as fh:
            return magic_format(fh.read(4)) == "gguf"
    except (IsADirectoryError, FileNotFoundError):
        return False


class _Part:
    """One mapped file of a model: a whole GGUF, or one part of a split set."""

    def __init__(self, path: str, preload: bool):
        self.path = path
        self.buf: np.ndarray | None = None
        self._mm = None
        try:
            fh = builtins.open(path, "rb")  # noqa: SIM115 -- the with below closes it
        except FileNotFoundError:
            raise CmfFileNotFound(f"{path}: no such file") from None
        except IsADirectoryError:
            raise FormatError(f"{path}: is a directory, not a GGUF file") from None
        with fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise FormatError(f"{path}: empty file (a GGUF file starts with {MAGIC!r})")
            if preload:
                self.buf, self._mm = anon_copy(fh, size, path)
            else:
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                self.buf = np.frombuffer(self._mm, dtype=np.uint8)
        try:
            self.layout: GgufLayout = parse(self.buf, path)
            self.split = split_keys(self.layout.metadata, path)
        except BaseException:
            self.close()
            raise

    @property
    def size(self) -> int:
        return int(self.buf.size) if self.buf is not None else 0

    def bytes(self, offset: int, nbytes: int) -> np.ndarray:
        if self.buf is None:
            raise ValueError(f"{self.path}: file is closed")
        return self.buf[offset:offset + nbytes]

    def close(self) -> None:
        self.buf = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # views handed out are still alive; GC closes it later
                pass


class GgufFile(TensorDirectory):
    """An open Llama-family GGUF model (see the module docstring): one file, or every
    part of a split set (`cortiq.gguf.split`) mapped as one model."""

    preload: bool
    verify_mode: str

    def __init__(self, path, preload: bool = False, verify: str = "lazy"):
        if verify not in VERIFY_MODES:
            raise ConfigError(f"verify: expected one of {', '.join(map(repr, VERIFY_MODES))}, "
                              f"got {verify!r}")
        self.path = p = os.fspath(path)
        self.preload, self.verify_mode = bool(preload), verify
        self._parts: list[_Part] = []
        try:
            self._open_parts(_Part(p, self.preload))
            self._open()
        except BaseException:
            self.close()
            raise

    def _open_parts(self, given: _Part) -> None:
        """Map `given` and, when it is a part of a split set, every other part, checking
        that they form one set: the same count, each present once under its own number,
        no tensor name twice, the first part's tensor total."""
        self._parts = [given]
        if given.split is None:
            return
        no, count, _total = given.split
        paths = part_paths(given.path, no, count)
        by_index: dict[int, _Part] = {no: given}
        keys: dict[int, tuple] = {no: given.split}
        for i, path in enumerate(paths):
            if i not in by_index:
                if not os.path.exists(path):
                    raise FormatError(f"{given.path}: part {i + 1} of this {count}-part "
                                      f"split GGUF is missing: no file {path}")
                part = _Part(path, self.preload)
                self._parts.append(part)           # closed with the others on failure
                by_index[i] = part
                got = part.split
                if got is None or got[:2] != (i, count):
                    says = "no split keys" if got is None else (
                        f"part {got[0] + 1} of {got[1]} ({SPLIT_NO} {got[0]}, {SPLIT_COUNT} "
                        f"{got[1]})")
                    raise FormatError(f"{path}: expected part {i + 1} of {count} of the "
                                      f"split GGUF {paths[0]}, but its metadata says {says}")
                keys[i] = got
        self._parts = [by_index[i] for i in range(count)]
        self.path = paths[0]               # the set is named by its first part
        total = keys[0][2]
        seen: dict[str, str] = {}
        for i, part in enumerate(self._parts):
            if keys[i][2] != total:
                raise FormatError(f"{part.path}: GGUF metadata {SPLIT_TENSORS} is "
                                  f"{keys[i][2]} but {paths[0]} says {total}: parts of "
                                  "different sets")
            for name in part.layout.tensors:
                if name in seen:
                    raise FormatError(f"{part.path}: GGUF tensor {name} is also in "
                                      f"{seen[name]}: a tensor may be in one part only")
                seen[name] = part.path
        if total is not None and len(seen) != total:
            raise FormatError(f"{paths[0]}: the {count} parts hold {len(seen)} tensors but "
                              f"{SPLIT_TENSORS} says {total}")

    @property
    def layout(self) -> GgufLayout:
        """The first file's parsed container: the model's metadata."""
        return self._parts[0].layout

    @property
    def buf(self) -> np.ndarray | None:
        """The first file's bytes (None once closed)."""
        return self._parts[0].buf if self._parts else None

    @property
    def nbytes(self) -> int:
        """Bytes of every file of the model."""
        return sum(part.size for part in self._parts)

    def ggml_type_counts(self) -> dict:
        """{ggml type name: number of tensors} over every file of the model."""
        out: dict = {}
        for part in self._parts:
            for t in part.layout.tensors.values():
                out[t.type.name] = out.get(t.type.name, 0) + 1
        return out

    def _open(self) -> None:
        p = self.path
        self.meta = Meta(self.layout.metadata, p)
        g = self.meta.need("general.architecture")
        if g not in architectures():
            raise ConfigError(f"{p}: GGUF general.architecture {g!r}; cortiq runs "
                              f"{', '.join(architectures())}")
        located = {n: (part, t) for part in self._parts for n, t in part.layout.tensors.items()}
        arch, g = arch_from_gguf(self.meta, {n: t.shape for n, (_, t) in located.items()})
        if "rope_freqs.weight" in located:
            part, t = located["rope_freqs.weight"]
            ff = dequantize(part.bytes(t.offset, t.nbytes), t.type, t.shape,
                            f"{part.path}: tensor rope_freqs.weight").ravel()
            if ff.size != arch["head_dim"] // 2:
                raise FormatError(f"{part.path}: GGUF tensor rope_freqs.weight has {ff.size} "
                                  f"values, head_dim {arch['head_dim']} needs "
                                  f"{arch['head_dim'] // 2}")
            arch["rope_freq_factors"] = [float(x) for x in ff]
        if g in PERMUTED:
            arch["rope_interleaved"] = True
        self.arch = arch
        self.gguf_architecture = g
        self.tensors: dict[str, GgufTensorInfo] = {}
        for name, (part, t) in located.items():
            try:
                h = hf_name(name)
            except ConfigError as e:
                raise FormatError(f"{part.path}: {e}") from None
            if h is not None:
                self.tensors[h] = GgufTensorInfo(h, name, t.type, t.shape, t.offset,
                                                 t.nbytes, part.path, part.buf)
        self._tokenizer: tuple | None = None

    # ---- what CmfFile offers ------------------------------------------------------
    masks = None
    sparse_index = None
    moe = None
    shard = None
    features = 0

    @property
    def skills(self) -> list:
        return []

    @property
    def files(self) -> list:
        """Every file of the model, the first part first."""
        return [part.path for part in self._parts]

    @property
    def quant_type(self) -> str:
        """The dtype holding most of the matrix bytes (a GGUF mixes several)."""
        by: dict = {}
        for t in self.tensors.values():
            if len(t.shape) == 2:
                by[t.dtype] = by.get(t.dtype, 0) + t.nbytes
        return max(by, key=lambda d: by[d]) if by else "f32"

    @property
    def provenance(self) -> dict:
        out = {"format": "gguf", "gguf_version": self.layout.version,
               "gguf_architecture": self.gguf_architecture,
               "name": self.meta.get("general.name")}
        if len(self._parts) > 1:
            out["split_count"] = len(self._parts)
        return out

    @property
    def tokenizer_config(self):
        return self._tokenizer_parts()[1]

    chat_bundle = tokenizer_config

    def tokenizer_json(self) -> bytes | None:
        """A tokenizer.json built from the tokenizer.* metadata, or None."""
        return self._tokenizer_parts()[0]

    def _tokenizer_parts(self) -> tuple:
        if self._tokenizer is None:
            try:
                self._tokenizer = tokenizer_from_gguf(self.meta)
            except (IndexError, TypeError, ValueError, KeyError) as e:
                raise FormatError(f"{self.path}: GGUF tokenizer metadata is inconsistent "
                                  f"({type(e).__name__}: {e})") from None
        return self._tokenizer

    def sections(self, file=None) -> dict:
        """{region: (offset, length)} of `file` (default: the first): ``metadata``
        (header, keys and tensor directory), ``data`` (the tensor payloads) and ``vocab``
        (the tokenizer.ggml.tokens value; (0, 0) when the file has no vocabulary)."""
        by_path = {part.path: part for part in self._parts}
        if file is not None and file not in by_path:
            raise ConfigError(f"{self.path}: {file!r} is not one of its files "
                              f"({', '.join(by_path)})")
        part = self._parts[0] if file is None else by_path[file]
        d = part.layout.data_offset
        return {"metadata": (0, d), "data": (d, part.size - d),
                "vocab": part.layout.key_spans.get("tokenizer.ggml.tokens", (0, 0))}

    def resolve(self, name: str, skill=None) -> str:
        if skill is not None:
            raise MissingTensor(f"{self.path}: unknown skill {skill!r}; a GGUF file has no "
                                "skills")
        return name

    def skill_tensors(self, skill) -> list:
        return []

    def raw(self, name: str) -> np.ndarray:
        """Zero-copy read-only uint8 view of the payload of `name` (the GGUF bytes)."""
        t = self.info(name)
        if not self._parts or self._parts[0].buf is None:
            raise ValueError(f"{self.path}: file is closed")
        return t._buf[t.offset:t.offset + t.nbytes]

    def tensor(self, name: str, skill=None) -> np.ndarray:
        """`name` decoded to float32."""
        t = self.info(self.resolve(name, skill))
        return dequantize(self.raw(t.name), t.ggml_type, t.shape,
                          f"{self.path}: tensor {t.name} ({t.gguf_name})")

    def verify(self, strict: bool = False) -> list:
        """GGUF stores no hashes: the structure (header, every key, every tensor's type,
        shape, alignment and extent) was checked on open, so there is nothing more to
        find; always []."""
        return []

    def __repr__(self):
        parts = f", parts={len(self._parts)}" if len(self._parts) > 1 else ""
        return (f"GgufFile({self.path!r}, arch={self.arch.get('arch_name')!r}, "
                f"tensors={len(self.tensors)}{parts})")


def open(path, preload: bool = False, verify: str = "lazy") -> GgufFile:
    """Open a Llama-family GGUF file read-only (mmap; preload=True copies it into
    anonymous memory); any part of a split set opens the whole set. `verify` is accepted
    for symmetry with `cortiq.cmf.open`: a GGUF has no hashes to check."""
    return GgufFile(path, preload, verify)

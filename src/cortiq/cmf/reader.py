"""CMF v2 reader: mmap, zero-copy, validated on open exactly like the Rust reader (§3).

    cf = cortiq.cmf.open("model.cmf")      # or any shard of a set
    cf = cortiq.cmf.open("model.cmf", preload=True)  # bytes copied to anonymous memory
    cf.arch["hidden_size"]; cf.tensors["lm_head.weight"].dtype
    w = cf.tensor("lm_head.weight")        # float32, dequantized by cmf.quant
    b = cf.raw("lm_head.weight")           # uint8 view into the map (read-only, no copy)
    cf.verify()                            # [] when every hash matches

Hash checks (`verify=`): a damaged file is refused, never run.

* "lazy" (the default): the header and directory hashes, and the masks/index section
  hashes, are checked on open (those sections are read on open anyway); each tensor's
  hash the first time its bytes are handed out (`raw`, `tensor`: once per tensor,
  thread-safe), and the vocab section's when the tokenizer is read. A model is built
  from every tensor, so building it checks them all -- one pass over the weights at
  hash64's ~14 GB/s on one core (see docs/PERFORMANCE.md), off the per-token path.
* "full": every hash on open (`verify(strict=True)`).
* "off": no hash is compared (`cortiq verify` uses this to list every problem itself).

A mismatch raises `HashMismatch` naming the file, the tensor or section and both hashes.

Nothing but the envelope, header, directory (and the masks/index sections, which are
validated on open) is read until a tensor is used -- unless preload=True: then every
file is read whole into private anonymous memory on open (huge pages where the OS
offers them, see cmf/_anon.py) and the views point there instead of into the map.
"""
from __future__ import annotations

import builtins
import mmap
import os
import re
import struct
import threading
from dataclasses import dataclass

import numpy as np

from . import quant as Q
from ._anon import anon_copy
from .errors import (BoundsError, CmfFileNotFound, FormatError, HashMismatch, InvalidMagic,
                     MissingTensor,
                     ParseError, UnknownDtype, UnsupportedFeature, UnsupportedVersion)
from .hash import hash64
from .masks import MaskDecodeError, Masks, parse_sparse_index
from .schema import HEADER, SchemaError, check, loads_strict

MAGIC = b"CMF\x01"
VERSION = 2
ENVELOPE_SIZE = 128
ENVELOPE = struct.Struct("<4sIII14Q")
DATA_ALIGN = 4096
TENSOR_ALIGN = 64
MAX_NDIM = 6
DIR_RECORD = 56

FEAT_TENSOR_DIR = 0x01
FEAT_BINARY_MASKS = 0x02
FEAT_QUANT_2F = 0x04
FEAT_DELTA_MASKS = 0x08
FEAT_HOT_PACKS = 0x10
FEAT_LOOP_MASKS = 0x20
FEAT_SKILL_FILE = 0x40
FEAT_GGML_BLOCKS = 0x80  # some tensor is a ggml block format (ids 64 + ggml type, §7.9)
SUPPORTED_FEATURES = (FEAT_TENSOR_DIR | FEAT_BINARY_MASKS | FEAT_QUANT_2F | FEAT_LOOP_MASKS
                      | FEAT_SKILL_FILE | FEAT_GGML_BLOCKS)

SECTIONS = ("header", "dir", "data", "masks", "vocab", "index")
#: envelope byte offset of each section's (off, len) pair
SECTION_FIELD = {s: 0x10 + 16 * i for i, s in enumerate(SECTIONS)}

DTYPE_NAMES = Q.DTYPE_NAMES
_NOT_SIZE_CHECKED = ("u8", "mix8_4", "q4_col", "vbit", "vbit_ro", "q1s", "q1t")

DIR_DTYPE = np.dtype([("name_off", "<u4"), ("name_len", "<u2"), ("dtype", "u1"),
                      ("ndim", "u1"), ("shape", "<u4", (6,)), ("off", "<u8"),
                      ("nbytes", "<u8"), ("hash", "<u8")])
assert DIR_DTYPE.itemsize == DIR_RECORD

SHARD_NAME = re.compile(r"^(?P<base>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.cmf$")


def shard_file_name(base: str, no: int, count: int) -> str:
    """`{base}-{no:05}-of-{count:05}.cmf` (§12)."""
    return f"{base}-{no:05d}-of-{count:05d}.cmf"


@dataclass(frozen=True)
class TensorInfo:
    """One directory record. `offset` is absolute in `file`."""
    name: str
    dtype: str
    shape: tuple
    offset: int
    nbytes: int
    hash: int
    file: str

    @property
    def numel(self) -> int:
        return Q.numel(self.shape)


VERIFY_MODES = ("lazy", "full", "off")


def _check_verify_mode(verify) -> str:
    if verify not in VERIFY_MODES:
        from ..errors import ConfigError
        raise ConfigError(f"verify: expected one of {', '.join(map(repr, VERIFY_MODES))}, "
                          f"got {verify!r}")
    return verify


class _Part:
    """One physical file: its map (or preloaded copy), envelope, header and directory
    (validated)."""

    def __init__(self, path: str, preload: bool = False, verify: str = "lazy"):
        self.path = path = os.fspath(path)
        try:
            fh = builtins.open(path, "rb")  # noqa: SIM115 -- the with below closes it
        except FileNotFoundError:
            raise CmfFileNotFound(f"{path}: no such file") from None
        except IsADirectoryError:
            raise FormatError(f"{path}: is a directory, not a CMF file") from None
        with fh:
            size = os.fstat(fh.fileno()).st_size
            self.size = size
            if size < ENVELOPE_SIZE:
                raise BoundsError(f"{path}: file is {size} bytes, shorter than the "
                                  f"{ENVELOPE_SIZE}-byte envelope (offset 0)")
            if preload:
                self.buf, self._mm = anon_copy(fh, size, path)
            else:
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                self.buf = np.frombuffer(self._mm, dtype=np.uint8)
        try:
            self._parse()
            if verify == "lazy":
                self._check(self._envelope_problems() + self._section_problems(
                    ("masks", "index")))
            elif verify == "full":
                self._check(self.verify())
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _check(problems):
        if problems:
            raise HashMismatch("; ".join(problems) + " -- the file is damaged")

    # ---- validation, in the Rust reader's order ----------------------------------
    def _parse(self):
        p = self.path
        f = ENVELOPE.unpack(self.buf[:ENVELOPE_SIZE].tobytes())
        magic, version, flags, feats = f[:4]
        vals = f[4:]
        if magic != MAGIC:
            raise InvalidMagic(f"{p}: bad magic {magic!r} at offset 0 (expected {MAGIC!r})")
        if version != VERSION:
            raise UnsupportedVersion(f"{p}: envelope version {version} at offset 0x4 "
                                     f"(only {VERSION} is supported)")
        if feats & ~SUPPORTED_FEATURES:
            raise UnsupportedFeature(
                f"{p}: required_features 0x{feats:x} at offset 0xc has unsupported bits "
                f"0x{feats & ~SUPPORTED_FEATURES:x}")
        self.flags, self.features = flags, feats
        self.sections = {s: (vals[2 * i], vals[2 * i + 1]) for i, s in enumerate(SECTIONS)}
        self.header_hash, self.dir_hash = vals[12], vals[13]
        for s in ("header", "dir"):
            if self.sections[s][1] == 0:
                raise BoundsError(f"{p}: {s} section is empty ({s}_len at offset "
                                  f"0x{SECTION_FIELD[s] + 8:x} is 0)")
        for s in SECTIONS:
            off, ln = self.sections[s]
            if ln and off + ln > self.size:
                raise BoundsError(f"{p}: {s} section [{off}, {off + ln}) runs past the end of "
                                  f"the file ({self.size} bytes; envelope offset "
                                  f"0x{SECTION_FIELD[s]:x})")
        data_off, data_len = self.sections["data"]
        if data_len and data_off % DATA_ALIGN:
            raise BoundsError(f"{p}: data_off {data_off} (envelope offset 0x30) is not a "
                              f"multiple of {DATA_ALIGN}")
        # header
        hoff, hlen = self.sections["header"]
        self.header_bytes = self.buf[hoff:hoff + hlen]
        try:
            self.header = loads_strict(self.header_bytes.tobytes())
            check(self.header, HEADER)
        except (ValueError, SchemaError) as e:
            raise ParseError(f"{p}: header JSON at offset {hoff}: {e}") from None
        self._parse_dir()
        # masks and sparse index
        self.masks = None
        moff, mlen = self.sections["masks"]
        if mlen:
            try:
                self.masks = Masks.parse(self.buf[moff:moff + mlen], self.header["arch"])
            except MaskDecodeError as e:
                raise ParseError(f"{p}: masks section at offset {moff}: {e}") from None
        ioff, ilen = self.sections["index"]
        self.sparse_index = None
        if ilen:
            try:
                self.sparse_index = parse_sparse_index(self.buf[ioff:ioff + ilen])
            except MaskDecodeError as e:
                raise ParseError(f"{p}: sparse index at offset {ioff}: {e}") from None

    def _parse_dir(self):
        p = self.path
        doff, dlen = self.sections["dir"]
        data_off, data_len = self.sections["data"]
        if dlen < 16:
            raise ParseError(f"{p}: directory at offset {doff} is {dlen} bytes, shorter than "
                             f"its 16-byte head")
        d = self.buf[doff:doff + dlen]
        self.dir_bytes = d
        count, pool_off = struct.unpack("<QQ", d[:16].tobytes())
        recs_end = 16 + DIR_RECORD * count
        if recs_end > dlen:
            raise ParseError(f"{p}: directory at offset {doff} claims {count} tensors "
                             f"({recs_end} bytes) but is {dlen} bytes")
        if pool_off > dlen or pool_off < recs_end:
            raise ParseError(f"{p}: directory name pool offset {pool_off} (at offset "
                             f"{doff + 8}) is outside [{recs_end}, {dlen}]")
        pool = d[pool_off:].tobytes()
        recs = np.frombuffer(d[16:recs_end].tobytes(), dtype=DIR_DTYPE)
        cols = {k: recs[k].tolist() for k in ("name_off", "name_len", "dtype", "ndim", "off",
                                              "nbytes", "hash")}
        shapes = recs["shape"].tolist()
        tensors = {}
        for i in range(count):
            at = doff + 16 + DIR_RECORD * i
            ndim = cols["ndim"][i]
            if ndim > MAX_NDIM:
                raise ParseError(f"{p}: directory record {i} at offset {at}: ndim {ndim} > 6")
            no, nl = cols["name_off"][i], cols["name_len"][i]
            if no + nl > len(pool):
                raise ParseError(f"{p}: directory record {i} at offset {at}: name range "
                                 f"[{no}, {no + nl}) outside the {len(pool)}-byte name pool")
            try:
                name = pool[no:no + nl].decode("utf-8")
            except UnicodeDecodeError:
                raise ParseError(f"{p}: directory record {i} at offset {at}: name is not "
                                 f"UTF-8") from None
            did = cols["dtype"][i]
            if did not in DTYPE_NAMES:
                raise UnknownDtype(f"{p}: tensor {name!r} (directory record at offset {at}): "
                                   f"unknown dtype id {did}")
            dtype = DTYPE_NAMES[did]
            shape = tuple(shapes[i][:ndim])
            off, nb = cols["off"][i], cols["nbytes"][i]
            where = f"{p}: tensor {name!r} (directory record at offset {at})"
            if off % TENSOR_ALIGN:
                raise BoundsError(f"{where}: data offset {off} is not a multiple of 64")
            if off + nb > data_len:
                raise BoundsError(f"{where}: payload [{off}, {off + nb}) runs past the "
                                  f"{data_len}-byte weight blob")
            if Q.numel(shape) >= 2 ** 64:
                raise BoundsError(f"{where}: shape {shape} overflows")
            if dtype in Q.GGML_FORMATS and Q.ggml_shape_error(dtype, shape):
                raise BoundsError(f"{where}: {Q.ggml_shape_error(dtype, shape)}")
            if dtype not in _NOT_SIZE_CHECKED:
                want = Q.expected_nbytes(dtype, shape)
                if want is not None and want != nb:
                    raise BoundsError(f"{where}: {dtype} {shape} needs {want} bytes, "
                                      f"directory says {nb}")
            if dtype in ("vbit", "vbit_ro"):
                start = data_off + off
                try:
                    Q.validate_vbit(self.buf[start:start + nb], shape, dtype)
                except FormatError as e:
                    raise BoundsError(f"{where}: {e}") from None
            if name in tensors:
                raise ParseError(f"{p}: duplicate tensor name {name!r} (directory record at "
                                 f"offset {at})")
            tensors[name] = TensorInfo(name, dtype, shape, data_off + off, nb,
                                       cols["hash"][i], p)
        self.tensors = tensors

    def _envelope_problems(self) -> list:
        p, problems = self.path, []
        if self.header_hash and hash64(self.header_bytes) != self.header_hash:
            problems.append(f"{p}: header hash mismatch (envelope offset 0x70 stores "
                            f"{self.header_hash:016x}, bytes hash to "
                            f"{hash64(self.header_bytes):016x})")
        if self.dir_hash and hash64(self.dir_bytes) != self.dir_hash:
            problems.append(f"{p}: directory hash mismatch (envelope offset 0x78 stores "
                            f"{self.dir_hash:016x}, bytes hash to "
                            f"{hash64(self.dir_bytes):016x})")
        return problems

    def _section_problems(self, sections=("masks", "vocab", "index")) -> list:
        p, problems = self.path, []
        for s, stored in (self.header.get("section_hashes") or {}).items():
            if s not in sections or stored is None:
                continue
            off, ln = self.sections[s]
            if not ln:
                continue
            try:
                want = int(stored, 16)
                if not 0 <= want < 2 ** 64 or not stored.strip():
                    raise ValueError
            except ValueError:
                problems.append(f"{p}: section_hashes.{s} {stored!r} is not a hex hash")
                continue
            got = hash64(self.buf[off:off + ln])
            if got != want:
                problems.append(f"{p}: {s} section at offset {off} hash mismatch (header "
                                f"says {want:016x}, bytes hash to {got:016x})")
        return problems

    def tensor_problem(self, t: TensorInfo) -> str | None:
        got = hash64(self.buf[t.offset:t.offset + t.nbytes])
        if got != t.hash:
            return (f"{self.path}: tensor {t.name!r} at offset {t.offset} hash mismatch "
                    f"(directory says {t.hash:016x}, payload hashes to {got:016x})")
        return None

    def verify(self) -> list:
        problems = self._envelope_problems() + self._section_problems()
        for t in self.tensors.values():
            bad = self.tensor_problem(t)
            if bad:
                problems.append(bad)
        return problems

    def close(self):
        self.buf = None
        self.header_bytes = self.dir_bytes = None
        mm, self._mm = getattr(self, "_mm", None), None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # views handed out are still alive; GC closes it later
                pass


class TensorDirectory:
    """Access by name to a model file's `tensors` ({name: info}), shared by `CmfFile` and
    `cortiq.gguf.GgufFile`."""

    path: str
    tensors: dict

    def names(self) -> list:
        return list(self.tensors)

    def __contains__(self, name) -> bool:
        return name in self.tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def info(self, name: str):
        try:
            return self.tensors[name]
        except KeyError:
            raise MissingTensor(f"{self.path}: no tensor {name!r}") from None

    def close(self) -> None:
        """Close every part the file opened (mapped or copied); idempotent."""
        for part in getattr(self, "_parts", []):
            part.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CmfFile(TensorDirectory):
    """An open CMF model: one file, or every shard of a set merged (see open())."""

    def __init__(self, path, preload: bool = False, verify: str = "lazy"):
        path = os.fspath(path)
        self.preload = bool(preload)
        self.verify_mode = _check_verify_mode(verify)
        # names whose payload hash matched (lazy mode); a set's `in` needs no lock
        self._verified: set = set()
        self._verify_lock = threading.Lock()
        first = _Part(path, self.preload, self.verify_mode)
        self._parts = [first]
        try:
            self._open_siblings(first)
        except BaseException:
            self.close()
            raise
        main = self._parts[0]
        self.path = main.path
        self.header = main.header
        self.masks = main.masks
        self.sparse_index = main.sparse_index
        self.tensors: dict = {}
        for part in self._parts:
            for name, info in part.tensors.items():
                if name in self.tensors:
                    self.close()
                    raise ParseError(f"{part.path}: tensor {name!r} also appears in "
                                     f"{self.tensors[name].file}")
                self.tensors[name] = info
        self._by_file = {p.path: p for p in self._parts}
        self._skill_ids = {s["id"] for s in self.skills}

    def _open_siblings(self, first: _Part):
        shard = first.header.get("shard")
        if not shard:
            return
        no, count = shard["no"], shard["count"]
        if not 1 <= no <= count:
            raise ParseError(f"{first.path}: header shard {{no: {no}, count: {count}}} is "
                             f"out of range")
        if count == 1:
            return
        folder, fname = os.path.split(first.path)
        m = SHARD_NAME.match(fname)
        if not m:
            raise ParseError(f"{first.path}: shard {no} of {count}, but the file name does "
                             f"not follow {{base}}-NNNNN-of-NNNNN.cmf, so its siblings "
                             f"cannot be found")
        if int(m["no"]) != no or int(m["count"]) != count:
            raise ParseError(f"{first.path}: file name says shard {int(m['no'])} of "
                             f"{int(m['count'])}, header says {no} of {count}")
        parts = []
        try:
            for k in range(1, count + 1):
                if k == no:
                    part = first
                else:
                    sib = os.path.join(folder, shard_file_name(m["base"], k, count))
                    try:
                        part = _Part(sib, self.preload, self.verify_mode)
                    except CmfFileNotFound:
                        raise CmfFileNotFound(f"{sib}: shard {k} of {count} is missing "
                                              f"(opened from {first.path})") from None
                parts.append(part)
                hs = part.header.get("shard") or {}
                if hs.get("no") != k or hs.get("count") != count:
                    raise ParseError(f"{part.path}: header shard is {hs or None}, expected "
                                     f"{{no: {k}, count: {count}}}")
        except BaseException:
            for q in parts:
                if q is not first:
                    q.close()
            raise
        self._parts = parts

    # ---- typed accessors ---------------------------------------------------------
    @property
    def arch(self) -> dict:
        return self.header["arch"]

    @property
    def moe(self):
        return self.arch.get("moe")

    @property
    def quant_type(self) -> str:
        return self.header["quant_type"]

    @property
    def tokenizer_config(self):
        return self.header.get("tokenizer_config")

    chat_bundle = tokenizer_config

    @property
    def skills(self) -> list:
        return self.header.get("skills", [])

    @property
    def shard(self):
        return self.header.get("shard")

    @property
    def provenance(self):
        return self.header.get("provenance")

    @property
    def files(self) -> list:
        return [p.path for p in self._parts]

    @property
    def features(self) -> int:
        return self._parts[0].features

    def sections(self, file=None) -> dict:
        """{section: (offset, length)} from the envelope of `file` (default: shard 1)."""
        return dict(self._part(file).sections)

    def _part(self, file=None) -> _Part:
        return self._parts[0] if file is None else self._by_file[file]

    # ---- tensors -----------------------------------------------------------------
    def resolve(self, name: str, skill=None) -> str:
        """The directory name used for `name` when `skill` is active (§11.1)."""
        if skill is None:
            return name
        cand = f"skill.{skill}.{name}"
        if cand in self.tensors:
            return cand
        if skill not in self._skill_ids and not any(
                k.startswith(f"skill.{skill}.") for k in self.tensors):
            raise MissingTensor(f"{self.path}: unknown skill {skill!r}; skills: "
                                f"{', '.join(sorted(self._skill_ids)) or 'none'}")
        return name

    def skill_tensors(self, skill) -> list:
        """Original names that `skill` replaces."""
        pre = f"skill.{skill}."
        return [k[len(pre):] for k in self.tensors if k.startswith(pre)]

    def raw(self, name: str) -> np.ndarray:
        """Zero-copy read-only uint8 view of the payload of `name`."""
        t = self.info(name)
        part = self._by_file[t.file]
        if part.buf is None:
            raise ValueError(f"{self.path}: file is closed")
        if self.verify_mode == "lazy" and name not in self._verified:
            self._verify_tensor(part, t)
        return part.buf[t.offset:t.offset + t.nbytes]

    def _verify_tensor(self, part: _Part, t: TensorInfo) -> None:
        """Compare `t`'s payload hash once (threads asking at the same time wait for
        the one that hashes)."""
        with self._verify_lock:
            if t.name in self._verified:
                return
            bad = part.tensor_problem(t)
            if bad:
                raise HashMismatch(f"{bad} -- the file is damaged: refusing to use it "
                                   f"(run cortiq verify for every problem)")
            self._verified.add(t.name)

    def tensor(self, name: str, skill=None) -> np.ndarray:
        """`name` (or its skill replacement) decoded to float32 (u8 stays uint8)."""
        real = self.resolve(name, skill)
        t = self.info(real)
        raw = self.raw(real)
        try:
            with np.errstate(all="ignore"):  # garbage payloads may decode to inf/nan
                return Q.dequantize(raw, t.dtype, t.shape)
        except FormatError as e:
            raise type(e)(f"{t.file}: tensor {real!r} at offset {t.offset}: {e}") from None

    # ---- other sections ----------------------------------------------------------
    def tokenizer_json(self):
        """The HF tokenizer.json bytes of the vocab section, or None."""
        part = self._parts[0]
        off, ln = part.sections["vocab"]
        if ln and self.verify_mode == "lazy" and "\0vocab" not in self._verified:
            part._check(part._section_problems(("vocab",)))
            self._verified.add("\0vocab")            # no tensor name starts with NUL
        return part.buf[off:off + ln].tobytes() if ln else None

    def verify(self, strict: bool = False) -> list:
        """Check the envelope hashes, section hashes and every tensor hash of every
        file. Returns one line per problem; empty = intact. strict=True raises
        HashMismatch (listing every problem) instead of returning a non-empty list."""
        out = []
        for part in self._parts:
            out.extend(part.verify())
        if strict and out:
            raise HashMismatch("; ".join(out))
        return out

    def __repr__(self):
        return (f"CmfFile({self.path!r}, arch={self.arch.get('arch_name')!r}, "
                f"tensors={len(self.tensors)}, files={len(self._parts)}"
                f"{', preload=True' if self.preload else ''})")


def open(path, preload: bool = False, verify: str = "lazy") -> CmfFile:
    """Open a CMF v2 file (or any shard of a set) with full §3 validation.

    verify="lazy" (default) checks each hash when its bytes are first used, "full"
    every hash on open, "off" none (see the module docstring); a mismatch raises
    HashMismatch.

    preload=True reads every file whole into private anonymous memory (2 MiB aligned,
    transparent huge pages where offered) instead of mapping it: a copy at open and
    memory not shared with the page cache, for faster decode (fewer TLB misses).
    Views stay read-only and zero-copy into that buffer; the file is never written."""
    return CmfFile(path, preload, verify)

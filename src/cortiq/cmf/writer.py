"""CMF v2 writer: streaming, bounded memory, deterministic, atomic (docs/cmf-format.md §14).

    with cortiq.cmf.Writer("out.cmf", arch=arch, quant="q8_row") as w:
        for name, array in checkpoint:       # one tensor at a time
            w.add(name, array)
    # or: cortiq.cmf.write("out.cmf", tensors, arch=arch, quant="q4_tiled")

Each tensor is encoded (dtype rules of §8), hashed and appended to a temporary blob
file as soon as it is added, so memory holds one tensor at a time. close() builds the
directory and header (header hash, directory hash, section hashes), writes
`<path>.tmp-<pid>` (envelope last), fsyncs it and renames it over `path`. Any
exception removes the temporaries and leaves an existing `path` untouched.
With max_shard_bytes the tensors are split greedily, in the order added, into
`{base}-{no:05}-of-{count:05}.cmf` files (§12).
"""
from __future__ import annotations

import json
import os
import re
import struct

import numpy as np

from ..errors import ConfigError, KernelError
from . import quant as Q
from .hash import hash64, hex16
from .masks import Masks
from .reader import (DATA_ALIGN, ENVELOPE, ENVELOPE_SIZE, FEAT_BINARY_MASKS, FEAT_LOOP_MASKS,
                     FEAT_GGML_BLOCKS, FEAT_QUANT_2F, FEAT_SKILL_FILE, FEAT_TENSOR_DIR, MAGIC, MAX_NDIM,
                     TENSOR_ALIGN, VERSION, shard_file_name)
from .schema import HEADER, SchemaError, check

#: quant_type header label for each file-level quant (§4: there is no q4t/q4tp/q2tp label)
QUANT_LABEL = {"q8_row": "Q8_ROW", "q8_2f": "Q8_2F", "q4_block": "Q4_BLOCK",
               "q4_tiled": "Q4_BLOCK", "q4tp": "Q4_BLOCK", "q2tp": "Q4_BLOCK", "vbit": "VBIT",
               "vbit_ro": "VBIT", "bf16": "BF16", "f16": "F16", "f32": "F32"}
BIG_TENSOR = 16 * 1024  # payloads of at least this many bytes start on a 4096 boundary

_F16_ALWAYS = (re.compile(r"(^|\.)mlp\.gate\.weight$"),
               re.compile(r"(^|\.)shared_expert_gate\.weight$"),
               re.compile(r"(^|\.)linear_attn\.in_proj_[ab]\.weight$"),
               re.compile(r"conv1d\.weight$"),
               re.compile(r"(^|\.)self_attn\.g_proj\.weight$"))
_COLS32 = ("q4_tiled", "q4tp", "q2tp", "vbit", "vbit_ro")


def choose_dtype(name: str, shape, quant: str) -> str:
    """The dtype §8 gives tensor `name` of `shape` in a file quantized as `quant`."""
    shape = tuple(int(d) for d in shape)
    if name.endswith("tid2eid"):
        return "f32"
    if quant == "f32":
        return "f32"
    n = Q.numel(shape)
    if len(shape) <= 1 or n < 32:
        return "f16"
    if any(p.search(name) for p in _F16_ALWAYS):
        return "f16"
    if quant in ("f16", "bf16", "q4_block"):
        return quant
    if len(shape) > 2:
        return "f16"  # what the Rust converter does for rank > 2
    if quant in _COLS32 and shape[1] % 32:
        return "q8_2f"
    return quant


def encode(array, dtype: str) -> np.ndarray:
    """Payload bytes of `array` as `dtype`: the C quantizers where they exist (bit-exact
    with cmf.quant), else the numpy reference."""
    if dtype == "u8":
        return np.ascontiguousarray(array, np.uint8).reshape(-1)
    a = np.ascontiguousarray(array, dtype=np.float32)
    try:
        from ..kernels import _kernels as K
    except ImportError:  # pragma: no cover - source tree without the extension
        return Q.quantize(a, dtype)
    try:
        if dtype == "f32":
            return a.astype("<f4", copy=False).reshape(-1).view(np.uint8)
        if dtype == "f16":
            if a.size and not np.isfinite(a).all() or a.size and np.abs(a).max() > Q._F16_MAX:
                return Q.quantize(a, dtype)  # raises the reference's ValueError
            return K.f32_to_f16(a)
        if dtype == "q8_row" and a.ndim == 2:
            return K.quantize_q8_row(a)
        if dtype == "q8_2f" and a.ndim == 2:
            return K.quantize_q8_2f(a)
        if dtype == "q4_block":
            return K.quantize_q4_block(a)
        if dtype == "q4_tiled":
            return K.quantize_q4_tiled(a)
    except KernelError as e:
        raise ValueError(f"cannot encode {dtype}: {str(e).split(': ', 1)[-1]}") from None
    return Q.quantize(a, dtype)


def _plain(v, path="arch"):
    """JSON-ready copy: numpy scalars/arrays become Python values, tuples become lists.
    Integers stay integers; nothing is coerced between int and float."""
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise ConfigError(f"{path}: keys must be strings, got {k!r}")
            out[k] = _plain(x, f"{path}.{k}")
        return out
    if isinstance(v, (list, tuple)):
        return [_plain(x, f"{path}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, np.ndarray):
        return _plain(v.tolist(), path)
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, float) and not np.isfinite(v):
        raise ConfigError(f"{path}: {v} cannot be stored in JSON")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise ConfigError(f"{path}: cannot store a {type(v).__name__} in the header")


def _copy_into(dst, src_path: str) -> None:
    """Append the file at src_path to the open file `dst` (kernel-side copy when the OS
    offers one, else 8 MiB chunks); leaves dst positioned at its end."""
    dst.flush()
    out_fd = dst.fileno()
    os.lseek(out_fd, 0, os.SEEK_END)
    with open(src_path, "rb", buffering=0) as src:
        n = os.fstat(src.fileno()).st_size
        done = 0
        if hasattr(os, "copy_file_range"):
            try:
                while done < n:
                    k = os.copy_file_range(src.fileno(), out_fd, n - done)
                    if k == 0:
                        break
                    done += k
            except OSError:
                pass  # e.g. cross-device on old kernels: finish with plain reads
        src.seek(done)
        os.lseek(out_fd, 0, os.SEEK_END)
        while True:
            chunk = src.read(8 << 20)
            if not chunk:
                break
            mv = memoryview(chunk)
            while mv:
                mv = mv[os.write(out_fd, mv):]
    dst.seek(0, os.SEEK_END)


class Payload:
    """A tensor already encoded: ``data`` (uint8) is its ``dtype`` payload for ``shape``.
    For converters that map a source format onto a CMF layout without requantizing
    (the writer checks the size, or the structure of a vbit payload, and stores it)."""
    __slots__ = ("data", "dtype", "shape")

    def __init__(self, data, dtype: str, shape):
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = np.frombuffer(data, np.uint8)
        self.data = np.ascontiguousarray(data, np.uint8).reshape(-1)
        self.dtype = dtype
        self.shape = tuple(int(d) for d in shape)


class _Shard:
    def __init__(self, blob_path: str):
        self.blob_path = blob_path
        self.fh = open(blob_path, "wb")  # noqa: SIM115 -- open while tensors stream in
        self.size = 0
        self.records: list = []  # (name, dtype_id, shape, off, nbytes, hash)


class Writer:
    """Streaming CMF writer; see the module docstring. Parameters:

    arch             header `arch` (required keys of §4.1, integers as ints)
    quant            file-level quant: q8_row, q8_2f, q4_block, q4_tiled, q4tp, q2tp,
                     vbit, vbit_ro, f16, bf16, f32
    tokenizer_json   bytes of HF tokenizer.json (the vocab section), or None
    tokenizer_config chat bundle dict (§4.4) or None
    skills           skills registry records (§11)
    masks            cortiq.cmf.Masks or None
    provenance       free-form JSON-able value or None
    dtypes           {name: dtype} overrides of the §8 rules
    progress         tqdm progress bar (when tqdm is installed); False = silent
    max_shard_bytes  split into shards whose blobs stay below this size (None = one file)
    total            number of tensors, for the progress bar
    """

    def __init__(self, path, *, arch, quant="q8_row", tokenizer_json=None,
                 tokenizer_config=None, skills=(), masks=None, provenance=None, dtypes=None,
                 progress=True, max_shard_bytes=None, total=None):
        self.path = os.fspath(path)
        if quant not in QUANT_LABEL:
            raise ConfigError(f"quant {quant!r} is not one of {', '.join(QUANT_LABEL)}")
        self.quant = quant
        self.arch = _plain(dict(arch), "arch")
        self.tokenizer_config = (None if tokenizer_config is None
                                 else _plain(dict(tokenizer_config), "tokenizer_config"))
        self.skills = _plain(list(skills), "skills")
        self.provenance = None if provenance is None else _plain(provenance, "provenance")
        self.dtypes = dict(dtypes or {})
        for n, d in self.dtypes.items():
            if d not in Q.DTYPES:
                raise ConfigError(f"dtypes[{n!r}]: unknown dtype {d!r}")
        if tokenizer_json is not None and not isinstance(tokenizer_json, (bytes, bytearray)):
            if isinstance(tokenizer_json, str):
                tokenizer_json = tokenizer_json.encode("utf-8")
            else:
                raise ConfigError("tokenizer_json must be bytes (the tokenizer.json file)")
        self.vocab = bytes(tokenizer_json) if tokenizer_json is not None else b""
        self.masks_bytes = b""
        if masks is not None:
            if not isinstance(masks, Masks):
                raise ConfigError("masks must be a cortiq.cmf.Masks")
            try:
                self.masks_bytes = masks.encode(self.arch)
            except ValueError as e:
                raise ConfigError(f"masks: {e}") from None
        if max_shard_bytes is not None and int(max_shard_bytes) <= 0:
            raise ConfigError("max_shard_bytes must be positive")
        self.max_shard_bytes = None if max_shard_bytes is None else int(max_shard_bytes)
        self._header_for(1, 1, set(), check_only=True)  # fail before any work
        self._names = set()
        self._shards = []
        self._tmp = []
        self._closed = False
        self.paths = []
        self._bar = None
        if progress:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, unit="tensor",
                                 desc=os.path.basename(self.path), leave=False)
        self._new_shard()

    # ---- building ----------------------------------------------------------------
    def _new_shard(self):
        k = len(self._shards) + 1
        blob = f"{self.path}.blob{k}.tmp-{os.getpid()}"
        self._tmp.append(blob)
        self._shards.append(_Shard(blob))

    def add(self, name: str, array, dtype: str | None = None) -> None:
        """Encode, hash and append one tensor. `array` may be a callable returning it."""
        if self._closed:
            raise ValueError(f"{self.path}: writer is closed")
        try:
            self._add(name, array, dtype)
        except BaseException:
            self.abort()
            raise

    def _add(self, name, array, dtype):
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor name must be a non-empty string, got {name!r}")
        bname = name.encode("utf-8")
        if len(bname) > 0xFFFF:
            raise ValueError(f"tensor name {name[:40]!r}... is {len(bname)} bytes (max 65535)")
        if name in self._names:
            raise ValueError(f"duplicate tensor name {name!r}")
        if callable(array):
            array = array()
        if isinstance(array, Payload):
            return self._add_payload(name, array)
        a = np.asarray(array)
        shape = tuple(int(d) for d in a.shape)
        if len(shape) > MAX_NDIM:
            raise ValueError(f"tensor {name!r}: {len(shape)}-D shape {shape} (max 6 dims)")
        if any(d > 0xFFFFFFFF for d in shape):
            raise ValueError(f"tensor {name!r}: dimension above 2^32-1 in {shape}")
        if dtype is None:
            dtype = self.dtypes.get(name)
        if dtype is None:
            dtype = "u8" if a.dtype == np.uint8 else choose_dtype(name, shape, self.quant)
        if dtype not in Q.DTYPES:
            raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r}")
        try:
            payload = encode(a, dtype)
        except ValueError as e:
            raise ValueError(f"tensor {name!r} {shape}: {e}") from None
        del a, array
        self._append(name, dtype, shape, payload)

    def add_encoded(self, name: str, payload, dtype: str, shape) -> None:
        """Append a tensor whose payload is already encoded as `dtype` (bytes laid out as
        docs/cmf-format.md §7 says, e.g. re-packed from another format without
        re-quantizing): add(name, Payload(payload, dtype, shape))."""
        self.add(name, Payload(payload, dtype, shape))

    def _add_payload(self, name, p: Payload):
        if p.dtype not in Q.DTYPES:
            raise ValueError(f"tensor {name!r}: unknown dtype {p.dtype!r}")
        if len(p.shape) > MAX_NDIM:
            raise ValueError(f"tensor {name!r}: {len(p.shape)}-D shape {p.shape} (max 6 dims)")
        if p.dtype in Q.GGML_FORMATS and Q.ggml_shape_error(p.dtype, p.shape):
            raise ValueError(f"tensor {name!r}: {Q.ggml_shape_error(p.dtype, p.shape)}")
        if p.dtype in ("vbit", "vbit_ro"):
            try:
                Q.validate_vbit(p.data, p.shape, p.dtype)
            except Exception as e:  # noqa: BLE001 -- any payload fault: the writer's ValueError
                raise ValueError(f"tensor {name!r}: {e}") from None
        self._append(name, p.dtype, p.shape, p.data)

    def _append(self, name, dtype, shape, payload) -> None:
        nbytes = int(payload.nbytes)
        want = Q.expected_nbytes(dtype, shape)
        if want is not None and want != nbytes:
            raise ValueError(f"tensor {name!r}: {dtype} payload is {nbytes} bytes, the format "
                             f"needs {want} for {shape}")
        h = hash64(payload)
        sh = self._shards[-1]
        align = DATA_ALIGN if nbytes >= BIG_TENSOR else TENSOR_ALIGN
        off = -(-sh.size // align) * align
        if (self.max_shard_bytes and sh.records and off + nbytes > self.max_shard_bytes):
            self._new_shard()
            sh = self._shards[-1]
            off = 0
        if off > sh.size:
            sh.fh.write(b"\0" * (off - sh.size))
        sh.fh.write(memoryview(payload).cast("B"))
        sh.size = off + nbytes
        sh.records.append((name, Q.DTYPES[dtype], shape, off, nbytes, h))
        self._names.add(name)
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(f"{name[-40:]}", refresh=False)

    # ---- header ------------------------------------------------------------------
    def _header_for(self, no, count, dtype_ids, check_only=False, section_hashes=None):
        h = {"format": "cmf", "version": VERSION, "arch": self.arch,
             "quant_type": QUANT_LABEL[self.quant]}
        if self.provenance is not None:
            h["provenance"] = self.provenance
        if no == 1 and self.tokenizer_config is not None:
            h["tokenizer_config"] = self.tokenizer_config
        if section_hashes:
            h["section_hashes"] = section_hashes
        if no == 1 and self.skills:
            h["skills"] = self.skills
        if count > 1 or self.max_shard_bytes:
            h["shard"] = {"no": no, "count": count}
        try:
            check(h, HEADER)
        except SchemaError as e:
            raise ConfigError(f"{self.path}: header field {e}") from None
        if check_only:
            return None
        return json.dumps(h, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")

    @staticmethod
    def _directory(records) -> bytes:
        count = len(records)
        pool_off = 16 + 56 * count
        head = bytearray(struct.pack("<QQ", count, pool_off))
        pool = bytearray()
        for name, did, shape, off, nbytes, h in records:
            b = name.encode("utf-8")
            dims = list(shape) + [0] * (MAX_NDIM - len(shape))
            head += struct.pack("<IHBB6IQQQ", len(pool), len(b), did, len(shape), *dims,
                                off, nbytes, h)
            pool += b
        return bytes(head + pool)

    # ---- finishing ---------------------------------------------------------------
    def close(self) -> None:
        """Write the file(s) atomically. Idempotent."""
        if self._closed:
            return
        try:
            self._finish()
        except BaseException:
            self.abort()
            raise
        finally:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def _final_paths(self, count):
        if not self.max_shard_bytes:
            return [self.path]
        base = self.path.removesuffix(".cmf")
        return [shard_file_name(base, k, count) for k in range(1, count + 1)]

    def _finish(self):
        for sh in self._shards:
            sh.fh.flush()
            sh.fh.close()
        count = len(self._shards)
        finals = self._final_paths(count)
        temps = [f"{p}.tmp-{os.getpid()}" for p in finals]
        self._tmp.extend(temps)
        loops = int(self.arch.get("num_loops", 1) or 1)
        for k, (sh, final, tmp) in enumerate(zip(self._shards, finals, temps), start=1):
            masks = self.masks_bytes if k == 1 else b""
            vocab = self.vocab if k == 1 else b""
            shashes = {}
            if masks:
                shashes["masks"] = hex16(hash64(masks))
            if vocab:
                shashes["vocab"] = hex16(hash64(vocab))
            dids = {r[1] for r in sh.records}
            header = self._header_for(k, count, dids, section_hashes=shashes or None)
            directory = self._directory(sh.records)
            feats = FEAT_TENSOR_DIR
            if masks:
                feats |= FEAT_BINARY_MASKS | (FEAT_LOOP_MASKS if loops > 1 else 0)
            if dids & {Q.DTYPES["vbit"], Q.DTYPES["q8_2f"]}:
                feats |= FEAT_QUANT_2F
            if dids & {f.cmf_id for f in Q.GGML_FORMATS.values()}:
                feats |= FEAT_GGML_BLOCKS
            if k == 1 and any(isinstance(s, dict) and s.get("base_dir_hash")
                              for s in self.skills):
                feats |= FEAT_SKILL_FILE
            header_off = ENVELOPE_SIZE
            dir_off = header_off + len(header)
            data_off = -(-(dir_off + len(directory)) // DATA_ALIGN) * DATA_ALIGN
            data_len = sh.size
            pos = data_off + data_len
            masks_off, pos = (pos, pos + len(masks)) if masks else (0, pos)
            vocab_off, pos = (pos, pos + len(vocab)) if vocab else (0, pos)
            env = ENVELOPE.pack(MAGIC, VERSION, 0, feats, header_off, len(header), dir_off,
                                len(directory), data_off, data_len, masks_off, len(masks),
                                vocab_off, len(vocab), 0, 0, hash64(header), hash64(directory))
            with open(tmp, "wb") as fh:
                fh.write(b"\0" * ENVELOPE_SIZE)  # the real envelope goes in last
                fh.write(header)
                fh.write(directory)
                fh.write(b"\0" * (data_off - dir_off - len(directory)))
                _copy_into(fh, sh.blob_path)
                fh.seek(0, os.SEEK_END)
                if fh.tell() != data_off + data_len:
                    raise OSError(f"{tmp}: blob copy wrote {fh.tell() - data_off} of "
                                  f"{data_len} bytes")
                fh.write(masks)
                fh.write(vocab)
                fh.flush()
                os.fsync(fh.fileno())
                fh.seek(0)
                fh.write(env)
                fh.flush()
                os.fsync(fh.fileno())
            os.remove(sh.blob_path)
        for final, tmp in zip(finals, temps):
            os.replace(tmp, final)
        _fsync_dir(os.path.dirname(os.path.abspath(finals[0])))
        self._tmp = []
        self._closed = True
        self.paths = finals

    def abort(self) -> None:
        """Discard everything written so far (temporaries only; `path` is untouched)."""
        for sh in self._shards:
            try:
                sh.fh.close()
            except OSError:
                pass
        for t in self._tmp:
            try:
                os.remove(t)
            except OSError:
                pass
        self._tmp = []
        self._closed = True
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write(path, tensors, *, arch, quant="q8_row", tokenizer_json=None, tokenizer_config=None,
          skills=(), masks=None, provenance=None, dtypes=None, progress=True,
          max_shard_bytes=None) -> None:
    """Write a CMF file from `tensors`: an iterable (or dict) of (name, array) or
    (name, callable returning array). See Writer."""
    if isinstance(tensors, dict):
        tensors = tensors.items()
    total = len(tensors) if hasattr(tensors, "__len__") else None
    w = Writer(path, arch=arch, quant=quant, tokenizer_json=tokenizer_json,
               tokenizer_config=tokenizer_config, skills=skills, masks=masks,
               provenance=provenance, dtypes=dtypes, progress=progress,
               max_shard_bytes=max_shard_bytes, total=total)
    with w:
        for name, array in tensors:
            w.add(name, array)

"""The masks section (docs/cmf-format.md §9) and the deprecated sparse index (§10).

Section layout:
    u32 n_masks | u32 meta_len | meta JSON | mask blobs (each 8-aligned from the start)
Blob: ffn rows R x ceil(I/8), head rows L x ceil(H/8), layer gates ceil(L/8), expert rows
L x ceil(E/8) (only with has_expert_fields); bitfields LSB-first, 1 = active.
R = num_layers (legacy) or num_layers*num_loops (per visit, told apart by blob_len).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import numpy as np

from .schema import MASK_RECORD, MASKS_META, SchemaError, check, loads_strict

PRIORITIES = ("Fallback", "Normal", "Primary")


class MaskDecodeError(ValueError):
    """The masks section or sparse index is malformed (the reader turns it into ParseError)."""


def _nb(bits: int) -> int:
    return (bits + 7) // 8


def _dims(arch: dict):
    L = int(arch.get("num_layers", 0))
    inter = int(arch.get("intermediate_size", 0))
    heads = int(arch.get("num_attention_heads", 0))
    loops = int(arch.get("num_loops", 1) or 1)
    moe = arch.get("moe")
    experts = int(moe["num_experts"]) if moe else None
    return L, inter, heads, loops, experts


def blob_sizes(arch: dict, has_expert_fields: bool, rows: int) -> int:
    L, inter, heads, _, experts = _dims(arch)
    n = rows * _nb(inter) + L * _nb(heads) + _nb(L)
    if has_expert_fields:
        n += L * _nb(experts or 0)
    return n


def _unpack(b: np.ndarray, rows: int, width: int) -> np.ndarray:
    nb = _nb(width)
    m = np.unpackbits(b[:rows * nb].reshape(rows, nb), axis=1, bitorder="little")
    return m[:, :width].astype(bool)


def _pack(m: np.ndarray, rows: int, width: int, what: str) -> bytes:
    m = np.asarray(m)
    if m.shape != (rows, width):
        raise ValueError(f"mask {what} must have shape {(rows, width)}, got {m.shape}")
    nb = _nb(width)
    pad = np.zeros((rows, nb * 8), np.uint8)
    pad[:, :width] = m.astype(bool)
    return np.packbits(pad, axis=1, bitorder="little").tobytes()


@dataclass
class MaskTask:
    """One task's masks. Arrays are bool: ffn [R, intermediate] (R = layers or
    layers*loops), heads [layers, heads], layers [layers], experts [layers, E] or None."""
    name: str
    ffn: np.ndarray
    heads: np.ndarray
    layers: np.ndarray
    experts: np.ndarray | None = None
    task_id: int = 0
    sparsity: float = 0.0
    priority: str = "Normal"
    description: str | None = None
    parent: str | None = None
    quality: dict | None = None
    has_hot_pack: bool = False

    @property
    def per_visit(self) -> bool:
        return self.ffn.shape[0] != self.heads.shape[0]

    def ffn_for(self, layer: int, visit: int = 0) -> np.ndarray:
        """FFN neuron mask of `layer` on loop pass `visit` (legacy masks repeat)."""
        L = self.heads.shape[0]
        return self.ffn[visit * L + layer] if self.per_visit else self.ffn[layer]


@dataclass
class Masks:
    default_task: str
    tasks: list = field(default_factory=list)

    def names(self) -> list:
        return [t.name for t in self.tasks]

    def __contains__(self, name) -> bool:
        return any(t.name == name for t in self.tasks)

    def __getitem__(self, name) -> MaskTask:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(f"no mask task {name!r}; tasks: {', '.join(self.names())}")

    def __len__(self):
        return len(self.tasks)

    # ---- decode --------------------------------------------------------------
    @classmethod
    def parse(cls, buf, arch: dict) -> Masks:
        buf = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf
        if buf.size < 8:
            raise MaskDecodeError(f"section is {buf.size} bytes, shorter than its 8-byte head")
        n_masks, meta_len = struct.unpack("<II", buf[:8].tobytes())
        if 8 + meta_len > buf.size:
            raise MaskDecodeError(f"meta_len {meta_len} at offset 4 runs past the section "
                                  f"({buf.size} bytes)")
        try:
            meta = loads_strict(buf[8:8 + meta_len].tobytes())
            check(meta, MASKS_META, "meta")
        except (ValueError, SchemaError) as e:
            raise MaskDecodeError(f"meta JSON at offset 8: {e}") from None
        if len(meta["masks"]) != n_masks:
            raise MaskDecodeError(f"n_masks is {n_masks} but meta lists {len(meta['masks'])}")
        L, inter, heads, loops, experts = _dims(arch)
        out = cls(default_task=meta["default_task"])
        for i, rec in enumerate(meta["masks"]):
            hef = bool(rec.get("has_expert_fields", False))
            if hef and experts is None:
                raise MaskDecodeError(f"mask {rec['name']!r} has expert fields but arch has no moe")
            off, ln = rec["blob_off"], rec["blob_len"]
            if off + ln > buf.size:
                raise MaskDecodeError(f"mask {rec['name']!r} blob [{off}, {off + ln}) runs past "
                                      f"the section ({buf.size} bytes)")
            legacy = blob_sizes(arch, hef, L)
            visit = blob_sizes(arch, hef, L * loops)
            if ln == legacy:
                rows = L
            elif ln == visit:
                rows = L * loops
            else:
                raise MaskDecodeError(f"mask {rec['name']!r} blob_len {ln} is neither {legacy} "
                                      f"(legacy) nor {visit} (per visit)")
            b = buf[off:off + ln]
            p = 0
            ffn = _unpack(b[p:], rows, inter)
            p += rows * _nb(inter)
            hd = _unpack(b[p:], L, heads)
            p += L * _nb(heads)
            lg = _unpack(b[p:], 1, L)[0]
            p += _nb(L)
            ex = _unpack(b[p:], L, experts) if hef else None
            out.tasks.append(MaskTask(
                name=rec["name"], ffn=ffn, heads=hd, layers=lg, experts=ex,
                task_id=rec["task_id"], sparsity=rec["sparsity"], priority=rec["priority"],
                description=rec.get("description"), parent=rec.get("parent"),
                quality=rec.get("quality"), has_hot_pack=bool(rec.get("has_hot_pack", False))))
        return out

    # ---- encode --------------------------------------------------------------
    def encode(self, arch: dict) -> bytes:
        """The section bytes; the meta is re-serialized until its length is stable."""
        L, inter, heads, loops, experts = _dims(arch)
        if not self.tasks:
            raise ValueError("masks: at least one task is needed")
        blobs = []
        for t in self.tasks:
            if t.priority not in PRIORITIES:
                raise ValueError(f"mask {t.name!r}: priority must be one of {PRIORITIES}")
            rows = np.asarray(t.ffn).shape[0]
            if rows not in (L, L * loops):
                raise ValueError(f"mask {t.name!r}: ffn needs {L} or {L * loops} rows, got {rows}")
            parts = [_pack(t.ffn, rows, inter, f"{t.name}.ffn"),
                     _pack(t.heads, L, heads, f"{t.name}.heads"),
                     _pack(np.asarray(t.layers).reshape(1, -1), 1, L, f"{t.name}.layers")]
            if t.experts is not None:
                if experts is None:
                    raise ValueError(f"mask {t.name!r} has expert rows but arch has no moe")
                parts.append(_pack(t.experts, L, experts, f"{t.name}.experts"))
            blobs.append(b"".join(parts))
        meta_len = 0
        for _ in range(64):
            recs, off = [], (8 + meta_len + 7) // 8 * 8
            for t, blob in zip(self.tasks, blobs):
                r = {"task_id": int(t.task_id), "name": t.name}
                if t.description is not None:
                    r["description"] = t.description
                r["sparsity"] = float(t.sparsity)
                r["quality"] = t.quality
                if t.parent is not None:
                    r["parent"] = t.parent
                r.update(priority=t.priority, has_hot_pack=bool(t.has_hot_pack),
                         has_expert_fields=t.experts is not None, blob_off=off,
                         blob_len=len(blob))
                recs.append(r)
                off = (off + len(blob) + 7) // 8 * 8
            meta = json.dumps({"default_task": self.default_task, "masks": recs},
                              separators=(",", ":"), ensure_ascii=False).encode()
            if len(meta) == meta_len:
                break
            meta_len = len(meta)
        check(json.loads(meta), MASKS_META, "meta")
        out = bytearray(struct.pack("<II", len(self.tasks), meta_len) + meta)
        for r, blob in zip(recs, blobs):
            out.extend(b"\0" * (r["blob_off"] - len(out)))
            out.extend(blob)
        return bytes(out)


def parse_sparse_index(buf) -> list:
    """Decode the sparse index (§10) into [(task_id, layer, groups u16[], heads u8[])]."""
    buf = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf
    if buf.size < 8:
        raise MaskDecodeError(f"sparse index is {buf.size} bytes, shorter than its 8-byte head")
    n, _ = struct.unpack("<II", buf[:8].tobytes())
    if n * 16 > buf.size - 8:
        raise MaskDecodeError(f"sparse index claims {n} entries in {buf.size} bytes")
    p, out = 8, []
    for i in range(n):
        if p + 16 > buf.size:
            raise MaskDecodeError(f"sparse index entry {i} at offset {p} runs past the section")
        task, layer, ng, nh = struct.unpack("<IIII", buf[p:p + 16].tobytes())
        end = p + 16 + 2 * ng + nh
        if end > buf.size:
            raise MaskDecodeError(f"sparse index entry {i} at offset {p} runs past the section")
        groups = np.frombuffer(buf[p + 16:p + 16 + 2 * ng].tobytes(), "<u2")
        heads = buf[p + 16 + 2 * ng:end].copy()
        out.append((task, layer, groups, heads))
        p = (end + 3) // 4 * 4
    return out


_ = MASK_RECORD  # re-exported schema (documentation)

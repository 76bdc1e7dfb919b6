"""Weights stored beside a ``.scale`` tensor, as DeepSeek publishes its checkpoints.

Two kinds, told apart by the weight's safetensors dtype:

* **FP8**: ``F8_E4M3`` values ``[rows, cols]`` and one scale per ``block x block`` tile
  (128 unless ``quantization_config.weight_block_size`` says otherwise), the edge tiles
  ragged: scale shape ``[ceil(rows/block), ceil(cols/block)]``.
* **FP4**: E2M1 codes packed two a byte, element ``2i`` in the low nibble, stored as
  ``I8``/``U8 [rows, cols/2]`` (or ``F4 [rows, cols]``), and one scale per 32 elements of a
  row: ``[rows, ceil(cols/32)]``.

Scales are E8M0 exponents (``F8_E8M0`` or ``U8``) or plain multipliers (``F32``, ``BF16``,
``F16``, as ``scale_dtype: fp32`` checkpoints store them). The scale of ``x.weight`` is
``x.scale`` (DeepSeek) or ``x.weight_scale_inv`` (the FP8 spelling of DeepSeek-V3 and
transformers). Everything that can be checked without reading the payload -- dtypes,
the shape of the scale against its weight, an orphan scale -- is checked by ``pair`` /
``describe`` before anything is written, and the error names the tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import FormatError
from . import microfloat as M

if TYPE_CHECKING:
    from ._safetensors import SafetensorsShard

SCALE_SUFFIXES = (".weight_scale_inv", ".scale")
FP8_DTYPES = ("F8_E4M3",)
FP4_DTYPES = ("I8", "U8", "F4")
_E8M0_DTYPES = ("F8_E8M0", "U8")
_FLOAT_SCALE_DTYPES = ("F32", "BF16", "F16")
#: dtypes that are codes, never values: such a tensor without a scale is refused
CODE_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0", "F4")


def scale_base(name: str) -> str | None:
    """``x.weight`` for a scale tensor ``x.scale`` / ``x.weight_scale_inv``, else None."""
    for suf in SCALE_SUFFIXES:
        if name.endswith(suf):
            return name[: -len(suf)] + ".weight"
    return None


def pair(names) -> dict[str, str]:
    """``{weight name: scale name}`` over a checkpoint's names. ``x.scale`` is a scale only
    beside an ``x.weight`` (transformers' hyper-connection ``attn_hc.scale`` is not);
    a weight with two scales is refused."""
    names = set(names)
    out: dict[str, str] = {}
    for n in sorted(names):
        w = scale_base(n)
        if w is None or w not in names:
            continue
        if w in out:
            raise FormatError(f"{w}: two scale tensors ({out[w]}, {n})")
        out[w] = n
    return out


@dataclass
class ScaledWeight:
    """One FP8 or FP4 weight and its scale; ``load()`` gives the float32 values."""
    kind: str                 # "fp8" | "fp4"
    shard: SafetensorsShard   # the shard of the weight
    name: str
    scale_shard: SafetensorsShard
    scale_name: str
    shape: tuple              # logical [rows, cols]
    block: int                # FP8 tile edge or FP4 group length

    def scales(self) -> np.ndarray:
        """The float32 multipliers (E8M0 decoded); NaN or non-positive ones are refused."""
        sh, n = self.scale_shard, self.scale_name
        code = sh.dtype(n)
        if code in _E8M0_DTYPES:
            raw = sh.raw(n)
            if (raw == 255).any():
                raise FormatError(f"{n}: E8M0 scale 0xFF (NaN)")
            return M.E8M0[raw]
        s = sh.load(n)
        if not np.isfinite(s).all():
            raise FormatError(f"{n}: non-finite scale")
        return s.astype(np.float32)

    def load(self) -> np.ndarray:
        raw = self.shard.raw(self.name)
        s = self.scales()
        if self.kind == "fp8":
            out = M.dequant_fp8_blocks(raw, s, self.block)
        else:
            out = M.dequant_fp4_groups(raw.view(np.uint8), s, self.block)
        ok = np.isfinite(out)
        if not ok.all():
            r, c = np.argwhere(~ok)[0]
            raise FormatError(f"{self.name}: non-finite value at [{r}, {c}] (an E4M3 NaN "
                              f"code, or a scale that overflows float32)")
        return out

    def as_vbit5(self):
        """FP4 only: the same values as a CMF ``vbit`` payload at 5 bits a row, bit for bit
        (``exact_vbit5``)."""
        return exact_vbit5(self.shard.raw(self.name).view(np.uint8), self.scales(),
                           self.name, self.block)

    @property
    def source_dtype(self) -> str:
        return {"fp8": "E4M3", "fp4": "E2M1"}[self.kind]


def describe(shard, name: str, scale_shard, scale_name: str,
             fp8_block: int = M.FP8_BLOCK, fp4_group: int = M.FP4_GROUP) -> ScaledWeight:
    """Check a (weight, scale) pair's dtypes and shapes; FormatError names the tensor."""
    wdt, sdt = shard.dtype(name), scale_shard.dtype(scale_name)
    shape = tuple(int(d) for d in shard.shape(name))
    sshape = tuple(int(d) for d in scale_shard.shape(scale_name))
    if sdt not in _E8M0_DTYPES + _FLOAT_SCALE_DTYPES:
        raise FormatError(f"{scale_name}: scale dtype {sdt} is not E8M0 (F8_E8M0/U8) or a "
                          f"float ({'/'.join(_FLOAT_SCALE_DTYPES)})")
    if len(shape) != 2:
        raise FormatError(f"{name}: a scaled weight must be 2-D, got shape {list(shape)}")
    if wdt in FP8_DTYPES:
        kind, block, logical = "fp8", fp8_block, shape
        want = M.fp8_block_shape(*shape, fp8_block)
        what = f"one per {fp8_block}x{fp8_block} block"
    elif wdt in FP4_DTYPES:
        kind, block = "fp4", fp4_group
        logical = shape if wdt == "F4" else (shape[0], 2 * shape[1])
        want = M.fp4_scale_shape(*logical, fp4_group)
        what = f"one per {fp4_group} elements of a row"
    else:
        raise FormatError(f"{name}: dtype {wdt} with a scale ({scale_name}); cortiq reads "
                          f"F8_E4M3 (FP8) or packed E2M1 ({'/'.join(FP4_DTYPES)}) weights")
    if sshape != tuple(want):
        raise FormatError(f"{scale_name}: shape {list(sshape)} does not match its "
                          f"{wdt} weight {name} {list(logical)}: want {list(want)} ({what})")
    shard.raw(name)                      # offsets against the file, before anything runs
    scale_shard.raw(scale_name)
    return ScaledWeight(kind, shard, name, scale_shard, scale_name, tuple(logical), block)


#: 2 * E2M1 value of each code: the integers {0, 1, 2, 3, 4, 6, 8, 12} with sign
_E2M1_TWICE = (2 * M.E2M1).astype(np.int16)


def exact_vbit5(packed: np.ndarray, scale: np.ndarray, name: str = "",
                group: int = M.FP4_GROUP):
    """E2M1 codes x per-32 scales -> a CMF ``vbit`` payload (docs/cmf-format.md §7.6) that decodes
    to exactly the same float32 values.

    vbit stores ``(u - 15) * s`` with 5-bit ``u`` and one f16 ``s`` per 32 of a row:
    ``u = 15 + 2 * e2m1`` spans 3..27 and ``s = scale / 2`` is a power of two f16 holds
    (``2^-24 .. 2^15``) for every scale a real checkpoint has. The cost is 5.5 bits a
    weight against the source's 4.25; q4tp (4.2) requantizes instead. A ``cortiq.cmf.
    writer.Payload``; ConfigError names the tensor when a scale has no exact f16 half."""
    from ..cmf.quant import f16_bytes
    from ..cmf.writer import Payload
    from ..errors import ConfigError
    rows, pc = packed.shape
    cols = 2 * pc
    if cols % 32 or group != 32:
        raise ConfigError(f"{name}: exact vbit needs cols a multiple of 32 and 32-element "
                          f"scale groups (got cols {cols}, group {group})")
    gpr = cols // 32
    half = (scale.astype(np.float32) / np.float32(2)).reshape(rows, gpr)
    codes = np.stack([packed & 0xF, packed >> 4], axis=2).reshape(rows, cols)
    live = (codes & 0x7).reshape(rows, gpr, 32).any(axis=2)   # groups holding a non-zero
    h16 = half.astype(np.float16)
    if not np.array_equal(h16.astype(np.float32)[live], half[live]):
        r, g = np.argwhere(live & (h16.astype(np.float32) != half))[0]
        raise ConfigError(f"{name}: scale {float(scale[r, g])!r} at [{r}, {g}] has no exact "
                          f"f16 half; use a requantizing --experts-quant (q4tp)")
    h16 = np.where(live, h16, np.float16(0))
    u = (15 + _E2M1_TWICE[codes]).astype(np.uint8)
    bits = np.unpackbits(u[:, :, None], axis=2)[:, :, 3:]        # 5 bits, MSB first
    rows_packed = np.packbits(bits.reshape(rows, cols * 5), axis=1)
    data = np.concatenate([np.full(rows, 5, np.uint8), f16_bytes(h16).reshape(-1),
                           rows_packed.reshape(-1)])
    return Payload(data, "vbit", (rows, cols))

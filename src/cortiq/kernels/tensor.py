"""QTensor: one stored 2-D weight matrix, multiplied in place from its CMF payload.

The matrix is ``[rows, cols] = [out_features, in_features]``. Activations are float32
and weights decode to exactly the float32 values of ``cortiq.cmf.quant.dequantize``;
every product runs through the C kernels of ``csrc/matvec`` (scalar reference or its
AVX2/AVX-512 twin, output rows split over the kernel pool, bit-identical for any thread count).

Exactness contract (see docs/ARCHITECTURE.md, "matvec"):
* ``matvec`` / ``row_dot`` / ``rows_dot`` / ``matvec_many`` give bit-identical results for the same
  row and input (and any thread count).
* ``matmat`` equals ``t`` matvecs within float32 rounding (same weights, a different
  summation order), not bitwise (under ``CORTIQ_ISA=ref`` they are bitwise equal).
* Against a float64 dot of the dequantized weights every result is within float32
  rounding of ``sum |w * x|``.

All of that holds for ``precision="exact"`` (the default of a QTensor made by hand).
With ``precision="int8"`` (or ``"auto"`` for the 4-bit-and-below dtypes) the products of
q8_row, q8_2f, q4_block, q4_tiled, q4tp, q2tp and the ggml K-quants (q2_k, q3_k, q4_k,
q5_k, q6_k, iq4_xs; ``"auto"`` takes these to int8 too, as llama.cpp does, except in
matmat, which reads float32 x for them) quantize x to int8 per group of 32 and
sum in integers: deterministic and still bit-identical across matvec / row_dot /
rows_dot / matvec_many and thread counts, within a documented error of the exact
product (docs/ARCHITECTURE.md, "int8 activations"). ``"auto"`` also takes q8_row and
q8_2f to int8 in ``matmat(X, prompt=True)``, the call a model makes for a chunk of a
prompt: prefill is bound by arithmetic, where integer products are 2-3x faster, while
decode (``matvec``, and ``matmat`` of batched decode rows, ``prompt=False``) stays
exact for q8. Models call ``matmat(prompt=True)`` for every prompt row, a piece of one
row included, so a row's arithmetic depends on whether it is a prompt row or a
generated token, never on how the prompt was cut. ``precision=None`` follows the
process default (``cortiq.set_precision``), which is what ``LLM`` gives its matrices.

The ggml block formats with kernels (``GGML_DTYPES``: q8_0, q4_0, ... read from a GGUF
file's own bytes, docs/cmf-format.md §7.9) take int8 activations under ``"auto"`` in
every product, q8_0 included, as llama.cpp quantizes x for all of them; under
``"exact"`` they decode each block to float32 (the values of ``gguf``'s dequantizers).
"""
from __future__ import annotations

import numpy as np

from . import _kernels as _K
from ..errors import FormatError

GGML_DTYPES = _K.GGML_DTYPES        # the ggml block formats the C side has kernels for
DTYPES = ("f32", "f16", "bf16", "q8_row", "q8_2f", "q4_block", "q4_tiled", "q4tp", "q2tp",
          "vbit", "vbit_ro") + GGML_DTYPES
VARIABLE = ("vbit", "vbit_ro")  # payload size depends on the data (validated on wrap)
I8_DTYPES = _K.I8_DTYPES            # dtypes with integer kernels (precision "int8")
AUTO_I8_DTYPES = _K.AUTO_I8_DTYPES  # ... of which "auto" takes the 4-bit-and-below ones
prompt_int8_dtypes = _K.prompt_int8_dtypes  # ... whose prompt matmat is int8 on this CPU


class QTensor:
    """A 2-D weight read in place from its payload bytes (uint8)."""

    __slots__ = ("_m", "cols", "dtype", "name", "rows")

    def __init__(self, raw, dtype: str, shape, name: str | None = None, precision="exact"):
        if dtype not in DTYPES:
            raise ValueError(f"QTensor: dtype {dtype!r} not supported; one of {', '.join(DTYPES)}")
        shape = tuple(int(s) for s in shape)
        if len(shape) != 2:
            raise ValueError(f"QTensor: shape must be 2-D (rows, cols), got {shape}")
        raw = np.asarray(raw)
        if raw.dtype != np.uint8:
            raise TypeError(f"QTensor: raw must be uint8 payload bytes, got {raw.dtype}")
        raw = np.ascontiguousarray(raw).reshape(-1)
        rows, cols = shape
        if dtype in VARIABLE:
            try:
                self._m = _K.QMat(raw, dtype, rows, cols)
            except ValueError as e:
                raise FormatError(f"QTensor{_at(name)}: {e}") from None
        else:
            need = _K.qmat_nbytes(dtype, rows, cols)
            if need == 0 and rows * cols:
                raise FormatError(f"QTensor{_at(name)}: {dtype} cannot hold shape {shape} "
                                  + ("(cols is not a whole number of its blocks)" if dtype in GGML_DTYPES
                                     else "(cols % 32 != 0)"))
            if raw.size != need:
                raise FormatError(f"QTensor{_at(name)}: {dtype} {shape} payload must be {need} "
                                  f"bytes, got {raw.size}")
            self._m = _K.QMat(raw, dtype, rows, cols)
        self.dtype, self.rows, self.cols, self.name = dtype, rows, cols, name
        self.precision = precision

    # ---- construction -------------------------------------------------------------
    @classmethod
    def from_cmf(cls, cmf_file, name: str, skill=None) -> QTensor:
        """Wrap tensor `name` of an open CmfFile (zero-copy view of the mapped payload).
        dtypes without a kernel (q1, q1s, q1t, u8, odd shapes) are dequantized once and
        kept as f32."""
        full = cmf_file.resolve(name, skill) if hasattr(cmf_file, "resolve") else name
        info = cmf_file.tensors[full]
        if len(info.shape) != 2:
            raise FormatError(f"QTensor: tensor {full!r} in {getattr(cmf_file, 'path', '?')} "
                              f"has shape {tuple(info.shape)}, needs 2-D")
        dtype = info.dtype
        ok = dtype in DTYPES and (dtype in VARIABLE and info.shape[1] % 32 == 0
                                  or _K.qmat_nbytes(dtype, *info.shape) == info.nbytes)
        if ok:
            return cls(cmf_file.raw(full), dtype, info.shape, name=full)
        dense = np.ascontiguousarray(cmf_file.tensor(full), np.float32)
        return cls(dense.view(np.uint8).reshape(-1), "f32", info.shape, name=full)

    # ---- properties -------------------------------------------------------------------
    @property
    def shape(self):
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        """Payload bytes (what a matvec streams from memory)."""
        return self._m.nbytes

    @property
    def raw(self) -> np.ndarray:
        return self._m.raw

    @property
    def qmat(self):
        """The kernel handle (``cortiq.kernels._kernels.QMat``) this tensor wraps: what the fused
        kernels take as a matrix argument (``dory_attn_row``, ``dory_mlp_row``, the lists of
        ``matvec_many`` and ``rows_sum``). It shares this tensor's payload and precision."""
        return self._m

    @property
    def precision(self):
        """"exact", "int8", "auto" or None (the process default, cortiq.set_precision)."""
        return self._m.precision

    @precision.setter
    def precision(self, p):
        from ._config import check_precision
        self._m.precision = check_precision(p, f"QTensor{_at(self.name)} precision")

    @property
    def int8(self) -> bool:
        """Whether products quantize x to int8 now (the precision resolved for this dtype)."""
        return self._m.int8

    @property
    def int8_prompt(self) -> bool:
        """Whether a prompt chunk's product (``matmat(X, prompt=True)``) quantizes x now."""
        return self._m.int8_prompt

    def __repr__(self):
        return f"QTensor({self.name or ''!s}{' ' if self.name else ''}{self.dtype} {self.rows}x{self.cols})"

    # ---- products -----------------------------------------------------------------------
    def matvec(self, x, out=None) -> np.ndarray:
        """W @ x for x [cols] float32 -> [rows] float32 (into `out` when given)."""
        return self._m.matvec(x, out)

    def matmat(self, X, out=None, prompt: bool = False) -> np.ndarray:
        """X [t, cols] -> X @ W.T [t, rows]; decodes each block of rows once for all t.
        `prompt`: X is a chunk of one sequence's prompt (prefill), which precision "auto"
        multiplies with int8 activations for the q8 dtypes too; leave it False for
        decode rows, batched or not, so that they keep matvec's arithmetic."""
        return self._m.matmat(X, out, prompt)

    def matvec_batch(self, X) -> np.ndarray:
        """X [t, cols] -> [t, rows], row j = matvec(X[j]) (within float32 rounding; bit
        for bit for t = 1 and int8 activations), the weights streamed once for all t:
        the decode rows of several sequences (matmat is for prompt chunks)."""
        return _K.matvec_batch([self._m], X)[0]

    @staticmethod
    def matvec_many(tensors, x, outs=None) -> list:
        """[T.matvec(x) for T in tensors] in one parallel pass (all share cols);
        bit-identical to the separate calls."""
        return _K.matvec_many([t.qmat for t in tensors], x, outs)

    def row(self, i: int, out=None) -> np.ndarray:
        """Row i decoded to float32 [cols] (embedding lookup)."""
        i = self._index(i)
        return self._m.dequant_rows(i, 1, out).reshape(self.cols)

    def rows_f32(self, r0: int, n: int, out=None) -> np.ndarray:
        """Rows r0 .. r0+n-1 decoded to float32 [n, cols]."""
        return self._m.dequant_rows(r0, n, out)

    def row_dot(self, i: int, x) -> float:
        """sum_c W[i, c] x[c]; bit-identical to matvec(x)[i]."""
        return self._m.row_dot(self._index(i), x)

    def rows_dot(self, r0: int, n: int, x, out=None) -> np.ndarray:
        """[W[r0 + j] . x for j < n] on the calling thread (x prepared once);
        bit-identical to matvec(x)[r0:r0 + n]."""
        return self._m.rows_dot(r0, n, x, out)

    def dequantize(self) -> np.ndarray:
        """The whole matrix as float32 [rows, cols]."""
        return self._m.dequant_rows(0, self.rows)

    def _index(self, i) -> int:
        i = int(i)
        if i < 0:
            i += self.rows
        if not 0 <= i < self.rows:
            raise IndexError(f"QTensor{_at(self.name)}: row {i} outside 0..{self.rows - 1}")
        return i


def _at(name):
    return f" {name!r}" if name else ""


def batch_products(tensors, X, decode=None) -> list:
    """[X @ T.T for T in tensors] for the rows of several sequences: the rows of
    generated tokens through `matvec_batch`, prompt rows through `matmat(prompt=True)`,
    so every row gets the arithmetic its kind gets when run alone (precision "auto"
    included: int8 for a q8 prompt row, however few rows its piece has), and each matrix
    is read once for all the decode rows. `decode`: a bool per row (True: a generated
    token), or one bool for every row (None: True)."""
    ms = [t.qmat for t in tensors]
    if decode is None or decode is True:
        return _K.matvec_batch(ms, X)
    if decode is False:
        return [m.matmat(X, None, True) for m in ms]
    decode = np.asarray(decode, bool)
    if decode.all():
        return _K.matvec_batch(ms, X)
    if not decode.any():
        return [m.matmat(X, None, True) for m in ms]
    one, many = np.flatnonzero(decode), np.flatnonzero(~decode)
    a = _K.matvec_batch(ms, X[one])
    out = []
    for m, y in zip(ms, a):
        z = np.empty((X.shape[0], m.rows), np.float32)
        z[one] = y
        z[many] = m.matmat(X[many], None, True)
        out.append(z)
    return out

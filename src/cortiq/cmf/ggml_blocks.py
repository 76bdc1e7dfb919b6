"""The ggml block formats that CMF stores as extension dtypes (docs/cmf-format.md §7.9).

A GGUF tensor's bytes are kept exactly as llama.cpp wrote them: a 2-D matrix
``[rows, cols]`` (GGUF ``ne = [cols, rows]``) is ``rows`` rows of ``cols / block_elems``
blocks each, every block ``block_bytes`` bytes in ggml's own layout. The CMF id of each
format is 64 + its ggml type number, so the two numberings can be read off each other;
the upstream CMF reader does not know these ids and refuses a file that holds them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockFormat:
    name: str          #: cortiq's dtype name (ggml's type name, lower case)
    ggml_type: int     #: ggml's ``GGMLQuantizationType`` number
    block_elems: int   #: weights a block holds (a row's cols must be a multiple)
    block_bytes: int   #: bytes a block takes

    @property
    def cmf_id(self) -> int:
        return 64 + self.ggml_type

    def nbytes(self, rows: int, cols: int) -> int:
        """Payload bytes of a [rows, cols] matrix (cols % block_elems == 0)."""
        return rows * (cols // self.block_elems) * self.block_bytes


#: name -> format, in ggml's numbering order
FORMATS: dict[str, BlockFormat] = {f.name: f for f in (
    BlockFormat("q4_0", 2, 32, 18),
    BlockFormat("q4_1", 3, 32, 20),
    BlockFormat("q5_0", 6, 32, 22),
    BlockFormat("q5_1", 7, 32, 24),
    BlockFormat("q8_0", 8, 32, 34),
    BlockFormat("q2_k", 10, 256, 84),
    BlockFormat("q3_k", 11, 256, 110),
    BlockFormat("q4_k", 12, 256, 144),
    BlockFormat("q5_k", 13, 256, 176),
    BlockFormat("q6_k", 14, 256, 210),
    BlockFormat("iq4_nl", 20, 32, 18),
    BlockFormat("iq4_xs", 23, 256, 136),
)}
#: ggml type number -> format
BY_GGML_TYPE: dict[int, BlockFormat] = {f.ggml_type: f for f in FORMATS.values()}
#: CMF dtype id -> format
BY_CMF_ID: dict[int, BlockFormat] = {f.cmf_id: f for f in FORMATS.values()}

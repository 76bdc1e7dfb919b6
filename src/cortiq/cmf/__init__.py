"""CMF v2 model files: reader, writer, quantizers (src/cortiq/cmf/quant.py is the layout spec).

    cortiq.cmf.open(path) -> CmfFile        validated, mmap-backed, zero-copy
    cortiq.cmf.open(path, preload=True)     the same over a copy in anonymous huge pages
    cortiq.cmf.open(path, verify="lazy")    hashes checked on first use ("full": on open,
                                            "off": never); a mismatch is HashMismatch
    cortiq.cmf.write(path, tensors, arch=..., quant="q8_row", ...)
    cortiq.cmf.Writer(path, arch=..., ...)  streaming: .add(name, array), .close()
    cortiq.cmf.hash64(data)                 the format's 64-bit digest (C kernel)
    cortiq.cmf.worth_preloading(path)       LLM's default for preload= (huge pages offered,
                                            the file at most half the available memory)
"""
from ._anon import worth_preloading
from .errors import (BoundsError, CmfFileNotFound, FormatError, HashMismatch, InvalidMagic,
                     MissingTensor, ParseError, UnknownDtype, UnsupportedFeature,
                     UnsupportedVersion)
from .hash import hash64, hash64_numpy
from .masks import Masks, MaskTask
from .reader import CmfFile, TensorInfo, open, shard_file_name
from .writer import Writer, choose_dtype, write

__all__ = [
    "BoundsError", "CmfFile", "CmfFileNotFound", "FormatError", "HashMismatch", "InvalidMagic",
    "MaskTask", "Masks", "MissingTensor", "ParseError", "TensorInfo", "UnknownDtype",
    "UnsupportedFeature", "UnsupportedVersion", "Writer", "choose_dtype", "hash64",
    "hash64_numpy", "open", "shard_file_name", "worth_preloading", "write",
]

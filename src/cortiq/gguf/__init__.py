"""GGUF (llama.cpp) model files, run in place: a strict parser of the container
(`parser`), what a Llama-family file's metadata and tensor names mean (`llama_meta`),
and the model file object `LLM` and the models read (`file.GgufFile`).

    cortiq.gguf.open(path) -> GgufFile      mmap-backed, the GGUF bytes as they are
    cortiq.gguf.is_gguf(path)               whether the file starts with b"GGUF"
    cortiq.gguf.magic_format(head)          "cmf", "gguf" or None for a file's first bytes

A split GGUF (llama.cpp's gguf-split parts, `split`) opens from any of its parts as
one model.
"""
from .file import MAGIC, GgufFile, GgufTensorInfo, dtype_of, is_gguf, magic_format, open

__all__ = ["MAGIC", "GgufFile", "GgufTensorInfo", "dtype_of", "is_gguf", "magic_format",
           "open"]

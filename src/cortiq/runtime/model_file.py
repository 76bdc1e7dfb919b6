"""Open a model file by what it holds, not by its name: a CMF file (magic ``CMF\\x01``)
through `cortiq.cmf.open`, a GGUF file (magic ``GGUF``) through `cortiq.gguf.open`."""
from __future__ import annotations

import builtins
import os

from .. import cmf as _cmf
from .. import gguf as _gguf
from ..errors import FormatError


def open_model_file(path, preload: bool = False,
                    verify: str = "lazy") -> _cmf.CmfFile | _gguf.GgufFile:
    """The open `CmfFile` or `GgufFile` at `path`; FormatError naming both accepted
    formats for a file that is neither (a missing file: `cmf.CmfFileNotFound`)."""
    p = os.fspath(path)
    try:
        with builtins.open(p, "rb") as fh:
            magic = fh.read(4)
    except IsADirectoryError:
        raise FormatError(f"{p}: a directory, not a model file; LLM.from_pretrained({p!r}) "
                          "opens a folder holding one model or converts a Hugging Face "
                          "checkpoint directory") from None
    except FileNotFoundError:
        from ..hub import parse_hub_id
        if parse_hub_id(p) is not None:
            raise _cmf.CmfFileNotFound(
                f"{p}: no such file; a Hugging Face Hub id opens with "
                f"LLM.from_pretrained({p!r}) (or cortiq run {p})") from None
        return _cmf.open(p, preload=preload, verify=verify)   # its own clear error
    kind = _gguf.magic_format(magic)
    if kind is not None:
        return (_cmf if kind == "cmf" else _gguf).open(p, preload=preload, verify=verify)
    raise FormatError(f"{p}: bad magic {magic!r} at offset 0: neither a CMF file "
                      f"({_cmf.reader.MAGIC!r}) nor a GGUF file ({_gguf.MAGIC!r})")

"""Split GGUF sets (llama.cpp's ``gguf-split``): how the parts are named and what their
``split.*`` keys say.

A model too large for one file ships as ``<prefix>-00001-of-00003.gguf``,
``<prefix>-00002-of-00003.gguf``, ... Each part is a complete GGUF file holding some of
the tensors (the first may hold none), and every part carries

* ``split.no`` -- its index, counted from 0 (the file name counts from 1),
* ``split.count`` -- how many parts the set has,
* ``split.tensors.count`` -- how many tensors the whole set holds.

Only the first part holds the model's metadata (architecture, sizes, tokenizer); the
others hold the three split keys and their tensors. A file without ``split.count`` (or
with a count of 1) is a whole model.
"""
from __future__ import annotations

import os
import re

from ..errors import FormatError

SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS = "split.tensors.count"
_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


def split_part(filename: str) -> tuple[str, int, int] | None:
    """(prefix, part counted from 1, number of parts) of a split part's file name (the
    last path component), None for a name outside the convention."""
    m = _NAME.match(os.path.basename(filename))
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def part_name(prefix: str, part: int, count: int) -> str:
    """The file name of part `part` (counted from 1) of a set of `count` parts."""
    return f"{prefix}-{part:05d}-of-{count:05d}.gguf"


def _count_value(meta: dict, key: str, path: str) -> int | None:
    v = meta.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise FormatError(f"{path}: GGUF metadata {key}: {v!r} is not a count")
    return v


def split_keys(meta: dict, path: str) -> tuple[int, int, int | None] | None:
    """(index from 0, number of parts, tensors in the set or None) of a part's metadata;
    None for a whole file. FormatError for keys that contradict each other."""
    count = _count_value(meta, SPLIT_COUNT, path)
    no = _count_value(meta, SPLIT_NO, path)
    total = _count_value(meta, SPLIT_TENSORS, path)
    if count is None or count == 1:
        if no not in (None, 0):
            raise FormatError(f"{path}: GGUF metadata {SPLIT_NO} is {no} but "
                              f"{SPLIT_COUNT} is {count if count is not None else 'missing'}")
        return None
    if count == 0:
        raise FormatError(f"{path}: GGUF metadata {SPLIT_COUNT} is 0")
    if no is None:
        raise FormatError(f"{path}: GGUF metadata {SPLIT_NO}: missing in a part of a set of "
                          f"{count} ({SPLIT_COUNT})")
    if no >= count:
        raise FormatError(f"{path}: GGUF metadata {SPLIT_NO} is {no}, outside a set of "
                          f"{count} parts (counted from 0)")
    return no, count, total


def part_paths(path: str, no: int, count: int) -> list[str]:
    """The paths of every part of the set `path` (part `no`, from 0) belongs to, found
    by its name. FormatError when the name does not follow the convention or disagrees
    with the part's split keys."""
    sp = split_part(path)
    want = part_name("<name>", no + 1, count)
    if sp is None:
        raise FormatError(f"{path}: GGUF part {no + 1} of a split into {count} files, but "
                          f"its name does not end in the split convention's {want[6:]!r} "
                          "(the other parts are found by their names): keep the names "
                          "llama.cpp's gguf-split gave the parts")
    prefix, part, of = sp
    if (part, of) != (no + 1, count):
        raise FormatError(f"{path}: the name says part {part} of {of} but its GGUF metadata "
                          f"says part {no + 1} of {count} ({SPLIT_NO} {no}, {SPLIT_COUNT} "
                          f"{count}): a renamed or mixed-up part")
    folder = os.path.dirname(path)
    return [os.path.join(folder, part_name(prefix, i + 1, count)) for i in range(count)]

"""Typed errors of the CMF reader, mirroring the Rust reader's error kinds (docs/cmf-format.md §3).

All are subclasses of cortiq.errors.FormatError; every message names the file and the
section or tensor, and the byte offset where that makes sense.
"""
from ..errors import FormatError


class InvalidMagic(FormatError):
    """The first 4 bytes are not CMF\\x01."""


class UnsupportedVersion(FormatError):
    """The envelope version is not 2."""


class UnsupportedFeature(FormatError):
    """required_features has a bit this reader does not support."""


class UnknownDtype(FormatError):
    """A directory record names a dtype id outside 0..16."""


class MissingTensor(FormatError, KeyError):
    """A tensor name is not in the directory."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class BoundsError(FormatError):
    """A section, tensor or size lies outside what the file holds."""


class ParseError(FormatError):
    """The header JSON, directory, masks or index cannot be decoded."""


class HashMismatch(FormatError):
    """A stored hash differs from the bytes (raised by callers of verify())."""


class CmfFileNotFound(FormatError, FileNotFoundError):
    """A model file (or a sibling shard) does not exist."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


__all__ = [
    "BoundsError",
    "CmfFileNotFound",
    "FormatError",
    "HashMismatch",
    "InvalidMagic",
    "MissingTensor",
    "ParseError",
    "UnknownDtype",
    "UnsupportedFeature",
    "UnsupportedVersion",
]

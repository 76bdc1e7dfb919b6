"""cortiq's exception hierarchy: every error a user can cause is one of these.

    CortiqError
    ├── FormatError        a model file is malformed or unsupported (cortiq.cmf)
    ├── KernelError        a C kernel refused its arguments ("operation: reason")
    ├── ConfigError        a bad option, environment variable or model config
    ├── TemplateError      a chat template failed to render
    └── ModelError         the model produced unusable output (e.g. non-finite logits)
"""


class CortiqError(Exception):
    """Base class of every error cortiq raises on purpose."""


class FormatError(CortiqError):
    """A CMF file is malformed, truncated or uses something cortiq cannot read."""


class KernelError(CortiqError):
    """A kernel rejected its inputs; the message reads "operation: reason"."""


class ConfigError(CortiqError, ValueError):
    """An option, environment variable or model configuration value is invalid."""


class TemplateError(CortiqError):
    """A chat template could not be rendered."""


class ModelError(CortiqError):
    """The model computed something unusable, e.g. NaN/inf logits (a damaged file or a
    broken model); the message names the position."""

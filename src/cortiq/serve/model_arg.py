"""The MODEL argument and its options, shared by every command that opens a model:
a .cmf or .gguf file, a Hugging Face checkpoint directory or a Hub id, resolved by
`cortiq.pretrained.resolve` (the same resolver as `LLM.from_pretrained`)."""
from __future__ import annotations

import argparse

from ..errors import ConfigError

MODEL_HELP = ("a .cmf or .gguf file, a Hugging Face checkpoint directory, or a Hub id "
              "org/name (org/name:Q4_K_M picks that quant of a GGUF repo); default: the "
              "bundled demo model")


def add_model_argument(p, *, conversions: bool = True) -> None:
    """MODEL and --filename/--revision/--quant/--progress on parser `p`."""
    p.add_argument("model", metavar="MODEL", nargs="?", default=None, help=MODEL_HELP)
    g = p.add_argument_group("model source")
    g.add_argument("--filename", default=None, metavar="NAME",
                   help="the exact file of the Hub repo to fetch (a .gguf)")
    g.add_argument("--revision", default=None, help="Hub branch, tag or commit")
    if conversions:
        g.add_argument("--quant", default=None,
                       help="CMF quant of a conversion (checkpoint directory or Hub "
                            "checkpoint: default q8_row; a GGUF: re-quantize into the cache)")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="download and conversion progress (default: on when stderr is a "
                        "terminal)")


def model_path(args) -> str | None:
    """The local model file for the parsed arguments (None: the bundled demo model)."""
    if args.model is None:
        for flag in ("filename", "revision", "quant"):
            if getattr(args, flag, None) is not None:
                raise ConfigError(f"--{flag} needs a MODEL")
        return None
    from ..pretrained import resolve
    return str(resolve(args.model, quant=getattr(args, "quant", None),
                       revision=args.revision, filename=args.filename,
                       progress=args.progress))

"""`cortiq convert [--arch ARCH] HF_DIR OUT.cmf [--quant Q] [--quiet]`."""
from __future__ import annotations

import json
from pathlib import Path

QUANTS = ("q8_row", "q8_2f", "q4_tiled", "q4tp", "q2tp", "f16", "bf16", "f32")


def _cmd_convert(args) -> int:
    from ..errors import ConfigError
    from . import from_hf
    cfg = Path(args.hf_dir) / "config.json"
    if args.arch:
        try:
            mt = json.loads(cfg.read_text()).get("model_type")
        except FileNotFoundError:
            raise ConfigError(f"{cfg}: missing (not a Hugging Face model directory)") from None
        if mt != args.arch:
            raise ConfigError(f"{cfg}: model_type {mt!r} does not match --arch {args.arch}")
    from_hf(args.hf_dir, args.out, quant=args.quant, progress=not args.quiet)
    return 0


def add_subcommands(sub) -> None:
    c = sub.add_parser("convert", help="convert a Hugging Face checkpoint to a CMF file")
    c.add_argument("hf_dir")
    c.add_argument("out")
    c.add_argument("--arch", choices=("dory", "deepseek_v4"), default=None,
                   help="expected model_type (default: read it from config.json)")
    c.add_argument("--quant", choices=QUANTS, default="q8_row")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.set_defaults(func=_cmd_convert)

"""`cortiq models` (what the model cache holds) and `cortiq rm NAME` (remove entries),
registered in src/cortiq/serve/cli.py. The cache itself: `cortiq.model_cache`."""
from __future__ import annotations

import json
import time

from .cmf_commands import _fmt_bytes


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def cmd_models(args) -> int:
    from ..model_cache import cache_dir, list_entries
    entries = list_entries(args.cache_dir)
    if args.json:
        print(json.dumps({"cache_dir": str(cache_dir(args.cache_dir)),
                          "models": [e.as_json() for e in entries]}))
        return 0
    if not entries:
        print(f"no models in {cache_dir(args.cache_dir)}")
        return 0
    head = ("NAME", "SOURCE", "FROM", "FORMAT", "QUANT", "SIZE", "LAST USED")
    rows = [(e.name, e.source or "-", e.source_kind, e.format, e.quant or "-",
             _fmt_bytes(e.size), _when(e.last_used)) for e in entries]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"{len(entries)} in {cache_dir(args.cache_dir)}, "
          f"{_fmt_bytes(sum(e.size for e in entries))}")
    return 0


def cmd_rm(args) -> int:
    from ..errors import ConfigError
    from ..model_cache import find_entries, remove
    if not args.names and not args.all:
        raise ConfigError("rm: give the NAME of an entry `cortiq models` lists, or --all")
    if args.names and args.all:
        raise ConfigError("rm: give names or --all, not both")
    for e in find_entries(args.names, cache=args.cache_dir, every=args.all):
        remove(e, args.cache_dir)
        print(f"removed {e.name} ({_fmt_bytes(e.size)})")
    return 0


def add_subcommands(sub) -> None:
    p = sub.add_parser("models", help="list the model cache (downloads and conversions)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--cache-dir", default=None,
                   help="default: CORTIQ_CACHE, else $XDG_CACHE_HOME/cortiq")
    p.set_defaults(func=cmd_models)
    r = sub.add_parser("rm", help="remove entries of the model cache")
    r.add_argument("names", nargs="*", metavar="NAME",
                   help="an entry's name as `cortiq models` lists it, or a unique prefix")
    r.add_argument("--all", action="store_true", help="every entry")
    r.add_argument("--cache-dir", default=None,
                   help="default: CORTIQ_CACHE, else $XDG_CACHE_HOME/cortiq")
    r.set_defaults(func=cmd_rm)

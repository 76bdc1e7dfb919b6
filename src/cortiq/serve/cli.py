"""The `cortiq` command line. User errors print one line and exit 1."""
import argparse
import sys

from ..kernels._config import __version__


def _cmd_config(args) -> int:
    from ..runtime.diagnostics import show_config
    show_config()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cortiq", description="Run language models (CMF, GGUF, Hugging Face checkpoints) on the CPU.")
    p.add_argument("--version", action="version", version=f"cortiq {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    c = sub.add_parser("config", help="show the kernel ISA, CPU features, threads and build")
    c.set_defaults(func=_cmd_config)
    from .cmf_commands import add_subcommands as _cmf_subcommands  # info, verify
    _cmf_subcommands(sub)
    from .commands import add_subcommands as _llm_subcommands  # run chat convert bench serve
    _llm_subcommands(sub)
    from .cache_commands import add_subcommands as _cache_subcommands  # models, rm
    _cache_subcommands(sub)
    for sp in sub.choices.values():      # main() reports an unknown flag with its usage
        sp.set_defaults(subparser=sp)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    # argparse hands a subcommand's unknown flags up to the top parser, whose usage line
    # says nothing of that subcommand's flags; report them with the subcommand's usage
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        getattr(args, "subparser", parser).error(
            f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # user errors become one line, not a traceback
        from ..errors import CortiqError
        if isinstance(e, (CortiqError, OSError)):
            print(f"cortiq: error: {e}", file=sys.stderr)
            return 1
        raise

"""The `coop` command: `coop train`, `coop sample`, `coop simulate`, `coop swarm`, `coop info`."""
from __future__ import annotations

import argparse
import importlib
import sys

import engine.__main__ as engine_info
from coop import __version__

# subcommand modules, each with add_parser(subparsers) that sets `run`
SUBCOMMANDS = ["coop.train", "coop.sample", "coop.simulate", "coop.gossip.cli"]


def _info(args) -> int:
    engine_info.main()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coop", description="Train one GPT together on pooled GPUs (DiLoCo).")
    parser.add_argument("--version", action="version", version=f"coop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.add_parser(sub)
    info = sub.add_parser("info", help="what engine was built with and which devices it sees")
    info.set_defaults(run=_info)
    return parser


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse argv and run the chosen subcommand's `run(args)`; help when none was chosen.
    Shared by `coop`, `coop-coordinator` and `coop-worker`."""
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 1
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())

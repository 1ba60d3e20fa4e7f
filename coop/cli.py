"""The `coop` command: `coop train`, `coop sample`, `coop export`, `coop simulate`, `coop swarm`, `coop info`."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

import engine.__main__ as engine_info
from coop import __version__
from coop.options import CommandParser

# subcommand modules, each with add_parser(subparsers) that sets `run`
SUBCOMMANDS = ["coop.train", "coop.sample", "coop.export", "coop.simulate", "coop.gossip.cli"]


def _info(args) -> int:
    engine_info.main()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="coop", description="Train one GPT together on pooled GPUs (DiLoCo).")
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
    for command in sub.choices.values():  # every command takes --log-level (coop swarm's may have it)
        if not any("--log-level" in action.option_strings for action in command._actions):
            command.add_argument("--log-level", default="warning", choices=LOG_LEVELS,
                                 help="how much coop logs (default: warning)")
    return parser


LOG_LEVELS = ["debug", "info", "warning", "error"]
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse argv and run the chosen subcommand's `run(args)`; help when none was chosen.
    Shared by `coop`, `coop-coordinator` and `coop-worker`."""
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what coop.launch starts once per rank
    if getattr(args, "log_level", None):
        logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
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

"""The commands of peer-to-peer mode.

`coop swarm start` starts a swarm as its first peer: `add_parser` is what `coop.cli` calls (list
"coop.gossip.cli" in its SUBCOMMANDS), `coop.gossip.peer.start_main(argv)` the same as a function.
Joining is `coop-worker join URL` (coop.worker_cli), which hands a peer's URL to
`coop.gossip.peer.join(url, args)`; `python -m coop.gossip.peer join URL` does the same without it.
"""
from __future__ import annotations

import argparse
import sys

from coop import launch
from coop.devices import describe_device
from coop.gossip.options import START_DESCRIPTION, add_start_options
from coop.gossip.peer import start_from_args
from coop.runconfig import EXAMPLE_TOML


def _print_example(args: argparse.Namespace) -> int:
    sys.stdout.write(EXAMPLE_TOML)
    return 0


def _start(args: argparse.Namespace) -> int:
    place = launch.current_rank()  # --gpus: the launcher says where its ranks are; rank 0 its device
    if not args.quiet and not launch.wants_launch(args) and (place is None or place.rank == 0):
        print(f"coop swarm start: device {describe_device(place.device if place else args.device)}",
              file=sys.stderr, flush=True)
    return start_from_args(args)


def add_parser(subparsers) -> None:
    """`coop swarm start ...` (called by coop.cli.build_parser)."""
    swarm = subparsers.add_parser("swarm", help="peer-to-peer mode: start a swarm without a coordinator",
                                  description="Peer-to-peer mode (docs/p2p.md). Start a swarm with `coop swarm "
                                              "start`; join it with `coop-worker join URL-OF-ANY-PEER`.")
    commands = swarm.add_subparsers(dest="swarm_command", metavar="SUBCOMMAND")
    start = commands.add_parser("start", help="start a swarm as its first peer", description=START_DESCRIPTION)
    add_start_options(start)
    start.set_defaults(run=_start)
    example = commands.add_parser("example-config", help="print a run config with the defaults, to edit",
                                  description="The same file as `coop-coordinator example-config`: one run "
                                              "config serves both modes ([coordinator] and [gossip] sections).")
    example.set_defaults(run=_print_example)

    def _help(args: argparse.Namespace) -> int:
        swarm.print_help()
        return 1

    swarm.set_defaults(run=_help)

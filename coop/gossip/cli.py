"""The commands of peer-to-peer mode.

`coop swarm start` starts a swarm as its first peer: `add_parser` is what `coop.cli` calls (list
"coop.gossip.cli" in its SUBCOMMANDS), `coop.gossip.peer.start_main(argv)` the same as a function.
Joining is `coop-worker join URL` (coop.worker_cli), which hands a peer's URL to
`coop.gossip.peer.join(url, args)`; `python -m coop.gossip.peer join URL` does the same without it.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

START_DESCRIPTION = ("Start a peer-to-peer swarm: this process is its first peer; others join with "
                     "`coop-worker join http://THIS-HOST:PORT` (through this peer or any other live one).")


def add_peer_options(parser: argparse.ArgumentParser, default_port: int | None) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all interfaces)")
    parser.add_argument("--port", type=int, default=default_port,
                        help="port to listen on (default: %(default)s; 0 or none: a free one)")
    parser.add_argument("--advertise", help="URL the other peers reach this peer at (default http://HOST:PORT)")
    parser.add_argument("--token", help="the swarm token, the same for every peer (default: $COOP_TOKEN)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--peer-id", help="this peer's id (default: 12 random hex digits)")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("--linger", type=float, default=0.0, help="after the last round, leave the swarm but keep "
                        "serving status and weights for this many seconds")


def add_start_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="run config (.toml, .yaml or .json; `coop swarm example-config` prints one, "
                        "the same file `coop-coordinator serve` reads); default: its defaults, a small GPT")
    parser.add_argument("--wait-peers", type=int, default=1, help="start round 0 once this many peers (this one "
                        "included) are in the swarm (default: %(default)s, start at once)")
    add_peer_options(parser, 8500)


def build_start_parser(prog: str = "coop swarm start") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=START_DESCRIPTION)
    add_start_options(parser)
    return parser


def build_join_parser(prog: str = "python -m coop.gossip.peer join") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Join a swarm through any live peer.")
    parser.add_argument("url", help="any live peer of the swarm, e.g. http://10.0.0.5:8500")
    add_peer_options(parser, None)
    return parser


def _sigterm_as_interrupt(signum, frame):  # docker stop / kubectl delete: leave cleanly, like Ctrl-C
    raise KeyboardInterrupt


def start_from_args(args: argparse.Namespace) -> int:
    from coop.gossip.peer import start_swarm
    from coop.runconfig import ConfigError, RunConfig, load_run_config

    try:
        config = load_run_config(args.config) if args.config else RunConfig()
    except ConfigError as error:
        print(f"coop swarm start: {error}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    return start_swarm(config, host=args.host, port=args.port, token=args.token or os.environ.get("COOP_TOKEN"),
                       advertise=args.advertise, device=args.device, wait_peers=args.wait_peers, quiet=args.quiet,
                       peer_id=args.peer_id, linger=args.linger)


def _print_example(args: argparse.Namespace) -> int:
    from coop.runconfig import EXAMPLE_TOML

    sys.stdout.write(EXAMPLE_TOML)
    return 0


def add_parser(subparsers) -> None:
    """`coop swarm start ...` (called by coop.cli.build_parser)."""
    swarm = subparsers.add_parser("swarm", help="peer-to-peer mode: start a swarm without a coordinator",
                                  description="Peer-to-peer mode (docs/p2p.md). Start a swarm with `coop swarm "
                                              "start`; join it with `coop-worker join URL-OF-ANY-PEER`.")
    commands = swarm.add_subparsers(dest="swarm_command", metavar="SUBCOMMAND")
    start = commands.add_parser("start", help="start a swarm as its first peer", description=START_DESCRIPTION)
    add_start_options(start)
    start.set_defaults(run=start_from_args)
    example = commands.add_parser("example-config", help="print a run config with the defaults, to edit",
                                  description="The same file as `coop-coordinator example-config`: one run "
                                              "config serves both modes ([coordinator] and [gossip] sections).")
    example.set_defaults(run=_print_example)

    def _help(args: argparse.Namespace) -> int:
        swarm.print_help()
        return 1

    swarm.set_defaults(run=_help)

"""The command-line options of a peer, shared by `coop swarm start` (coop.gossip.cli) and
`python -m coop.gossip.peer start|join` (coop.gossip.peer)."""
from __future__ import annotations

import argparse
import sys

from coop.devices import DEVICE_HELP, device_arg
from coop.throttle import Link, LinkLimits
from coop.launch import add_gpus_options

START_DESCRIPTION = ("Start a peer-to-peer swarm: this process is its first peer; others join with "
                     "`coop-worker join http://THIS-HOST:PORT` (through this peer or any other live one).")


def add_peer_options(parser: argparse.ArgumentParser, default_port: int | None) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all interfaces)")
    parser.add_argument("--port", type=int, default=default_port,
                        help="port to listen on (default: %(default)s; 0 or none: a free one)")
    parser.add_argument("--advertise", help="URL the other peers reach this peer at (default http://HOST:PORT)")
    parser.add_argument("--token", help="the swarm token, the same for every peer (default: $COOP_TOKEN)")
    parser.add_argument("--device", default="auto", type=device_arg, help=DEVICE_HELP)
    parser.add_argument("--key", help="this peer's Ed25519 key file (PEM; made there, mode 0600, if it does not "
                        "exist), so that it keeps its id across restarts (default: a new key at every start)")
    parser.add_argument("--peer-id", help="refuse to start unless the key's id is this (ids are derived from the key: "
                        "the first 12 hex digits of sha256(public key))")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("--linger", type=float, default=0.0, help="after the last round, leave the swarm but keep "
                        "serving status and weights for this many seconds")
    parser.add_argument("--out", default=None, metavar="DIR", help="write the final model here, as DIR/model.safetensors "
                        "(for `coop sample` and `coop export`; default: runs/peer-<peer id>)")
    add_link_options(parser)


def add_link_options(parser) -> None:
    """--limit-rate and --latency (coop.throttle): emulate an internet link for this process's transfers."""
    parser.add_argument("--limit-rate", default=None, metavar="RATE",
                        help="pace this process's own uploads and downloads to RATE each way, e.g. 100Mbit, 1Gbit, 10MB")
    parser.add_argument("--latency", default=None, metavar="DELAY",
                        help="add DELAY before each request and before its response, e.g. 50ms")


def link_from_args(args) -> Link | None:
    """The emulated link of --limit-rate / --latency, or None; a bad value exits 2 with one line."""
    try:
        limits = LinkLimits.parse(getattr(args, "limit_rate", None), getattr(args, "latency", None))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    return None if limits is None else Link(limits)


def add_start_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="run config (.toml, .yaml or .json; `coop swarm example-config` prints one, "
                        "the same file `coop-coordinator serve` reads); default: its defaults, a small GPT")
    parser.add_argument("--wait-peers", type=int, default=1, help="start round 0 once this many peers (this one "
                        "included) are in the swarm (default: %(default)s, start at once)")
    add_peer_options(parser, 8500)
    add_gpus_options(parser)  # --gpus: this peer's replica data parallel over several GPUs (coop.launch)


def build_start_parser(prog: str = "coop swarm start") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=START_DESCRIPTION)
    add_start_options(parser)
    return parser


def build_join_parser(prog: str = "python -m coop.gossip.peer join") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Join a swarm through any live peer.")
    parser.add_argument("url", help="any live peer of the swarm, e.g. http://10.0.0.5:8500")
    add_peer_options(parser, None)
    return parser

"""`coop-worker join URL`: lend this machine to a coop training run.

URL may be a coordinator (`coop-coordinator serve`) or any peer of a peer-to-peer run: the
worker asks `GET URL/v1/info` what it is talking to and behaves accordingly.

    coop-worker join http://HOST:8000 --token SECRET     # --device auto: the GPU if there is one
"""
from __future__ import annotations

import argparse
import functools
import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx

from coop import __version__, launch
from coop.cli import run_command
from coop.options import CommandParser
from coop.coordinator.worker import WorkerOptions, run_worker
from coop.data_parallel import run_rank
from coop.devices import DEVICE_HELP, describe_device, device_arg
from coop.gossip import peer
from coop.gossip.options import add_link_options, link_from_args


def add_shared_options(parser: argparse.ArgumentParser) -> None:
    """The options a worker has whether it joins a coordinator or a peer."""
    parser.add_argument("url", help="the coordinator's or a peer's address, e.g. http://10.0.0.5:8000")
    parser.add_argument("--token", default=None, help="the run's access token (default: $COOP_TOKEN)")
    parser.add_argument("--name", default=socket.gethostname(), help="shown on the status page (default: hostname)")
    parser.add_argument("--device", default="auto", type=device_arg, help=DEVICE_HELP)
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="keep downloaded data shards here (default: $COOP_CACHE or ~/.cache/coop; 'none' to disable)")
    parser.add_argument("--max-rounds", type=int, default=None, help="leave after contributing this many rounds")
    parser.add_argument("--retry-for", type=float, default=900.0, metavar="SECONDS",
                        help="keep retrying an unreachable server for this long before giving up (default: 900)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="for one download or upload (default: 600)")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    add_link_options(parser)
    launch.add_gpus_options(parser)
    peer = parser.add_argument_group("peer-to-peer runs (used only when URL is a peer: this worker serves too)")
    peer.add_argument("--host", default=None, help="address this peer listens on (default: 127.0.0.1; 0.0.0.0 for all)")
    peer.add_argument("--port", type=int, default=None, help="port this peer listens on (default: a free one)")
    peer.add_argument("--advertise", default=None, help="URL other peers reach this one at (default: http://HOST:PORT)")
    peer.add_argument("--key", default=None, help="this peer's Ed25519 key file, made if absent; its id derives "
                      "from the key (default: a new key at every start)")
    peer.add_argument("--peer-id", default=None, help="refuse to start unless the key's id is this")
    peer.add_argument("--linger", type=float, default=0.0,
                      help="after the last round, keep serving status and weights this many seconds (default: 0)")
    peer.add_argument("--out", default=None, metavar="DIR",
                      help="write the final model to DIR/model.safetensors (default: runs/peer-<peer id>)")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="coop-worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"coop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    join = sub.add_parser("join", help="join a run (coordinator or peer) and train until it ends")
    add_shared_options(join)
    join.set_defaults(run=join_command)
    return parser


def server_info(url: str, retry_for_s: float) -> dict:
    """GET URL/v1/info, retrying while the server is not up yet."""
    deadline = time.monotonic() + retry_for_s
    delay = 0.25
    while True:
        try:
            response = httpx.get(url.rstrip("/") + "/v1/info", timeout=10.0, follow_redirects=True)
            if response.status_code == 200:
                info = response.json()
                if isinstance(info, dict) and info.get("kind") in ("coordinator", "peer"):
                    return info
                raise SystemExit(f"coop-worker: {url} answered /v1/info with {info!r:.200}; is it a coop server?")
            problem = f"HTTP {response.status_code}"
            if response.status_code not in (502, 503, 504):
                raise SystemExit(f"coop-worker: {url}/v1/info -> {problem}; is it a coop server (coordinator or peer)?")
        except (httpx.TransportError, ValueError) as error:
            problem = f"{type(error).__name__}: {error}"
        if time.monotonic() > deadline:
            raise SystemExit(f"coop-worker: cannot reach {url} ({problem}); is the server running and the address right?")
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def _cache_dir(args) -> Path | None:
    if args.cache_dir is not None:
        return None if str(args.cache_dir).lower() == "none" else args.cache_dir
    if os.environ.get("COOP_CACHE"):
        return Path(os.environ["COOP_CACHE"])
    return Path.home() / ".cache" / "coop"


def _sigterm_as_interrupt(signum, frame):  # docker stop / kubectl delete: leave cleanly like Ctrl-C
    raise KeyboardInterrupt


def join_command(args) -> int:
    args.token = args.token or os.environ.get("COOP_TOKEN")
    link_from_args(args)  # a bad --limit-rate / --latency exits 2 here, before any connection
    if problem := launch.launch_problem("coop-worker", args):
        print(problem, file=sys.stderr)
        return 2
    if launch.wants_launch(args):  # --gpus: this process starts and watches one rank per GPU
        return launch.launch("coop-worker", "coop.worker_cli", args.argv, args)
    place = launch.current_rank()
    if place is not None:  # a rank of `--gpus`: rank 0 joins the run, the others follow it
        args.device = place.device
        args.quiet = args.quiet or place.rank != 0
        return run_rank("coop-worker", place, lambda factory: _join(args, factory, place))
    return _join(args)


def _join(args, replica_factory=None, place=None) -> int:
    if not args.quiet:  # --device was resolved (auto -> cuda or cpu) and checked by the parser
        print(f"coop-worker: device {describe_device(args.device)}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        info = server_info(args.url, args.retry_for)
    except KeyboardInterrupt:
        return 130
    if info["kind"] == "peer":  # (peers cap an update's tokens at one replica's: coop.data_parallel)
        args.replica_factory = replica_factory and functools.partial(replica_factory, counts_all_ranks=False)
        return int(peer.join(args.url, args) or 0)
    options = WorkerOptions(url=args.url, token=args.token, name=args.name, device=args.device,
                            cache_dir=_cache_dir(args), max_rounds=args.max_rounds, retry_for_s=args.retry_for,
                            timeout_s=args.timeout, quiet=args.quiet, link=link_from_args(args),
                            replica_factory=replica_factory, gpus=1 if place is None else place.world_size)
    return run_worker(options)


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())

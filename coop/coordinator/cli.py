"""`coop-coordinator`: run the HTTP coordinator of a DiLoCo training run.

    coop-coordinator example-config > run.toml
    coop-coordinator serve --config run.toml --state-dir state/ --host 0.0.0.0 --port 8000 --token SECRET
    coop-coordinator serve --state-dir state/          # resume the run saved there, with its config

Workers join with `coop-worker join http://HOST:8000 --token SECRET`. The status page is at
http://HOST:8000/, Prometheus metrics at /metrics, the API docs at /docs. Workers send their updates
to port 8001 (--upload-port) when they can reach it, else to 8000.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl
import sys
from pathlib import Path

import uvicorn

from coop import __version__
from coop.cli import run_command
from coop.init_from import seed_coordinator_state
from coop.memory import large_allocations_off_the_heaps
from coop.runconfig import EXAMPLE_TOML, ConfigError, load_run_config
from coop.serving import server_config

from .app import create_app
from .ingest import UploadPort
from .service import Coordinator

log = logging.getLogger("coop.coordinator")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coop-coordinator", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"coop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="serve a run (start a new one or resume the one in --state-dir)")
    serve.add_argument("--config", type=Path, help="run config (.toml, .yaml, .json); optional when resuming")
    serve.add_argument("--state-dir", type=Path, required=True, help="where the run is saved after every round")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 for every interface "
                                                            "(default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    serve.add_argument("--upload-port", type=int, default=None,
                       help="a second port that takes only the workers' updates, received by threads side by side "
                            "(several times the API's rate); workers that cannot reach it use the API's port. "
                            "0: none (default: --port + 1)")
    serve.add_argument("--token", default=None, help="access token workers must present to join "
                                                     "(default: $COOP_TOKEN; none = anyone who reaches the port may join)")
    serve.add_argument("--token-file", type=Path, help="read the access token from this file (e.g. a mounted secret)")
    serve.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM)")
    serve.add_argument("--ssl-keyfile", help="the certificate's private key (PEM)")
    serve.add_argument("--exit-when-done", type=float, default=None, metavar="SECONDS",
                       help="exit this many seconds after the last round (default: keep serving the status page)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(run=_serve)
    example = sub.add_parser("example-config", help="print a run config with the defaults, to edit (the same file serves `coop swarm start`)")
    example.set_defaults(run=_example)
    return parser


def _example(args) -> int:
    sys.stdout.write(EXAMPLE_TOML)
    return 0


def _read_token(args) -> str | None:
    if args.token_file:
        try:
            return args.token_file.read_text(encoding="utf-8").strip() or None
        except OSError as error:
            raise SystemExit(f"coop-coordinator: cannot read --token-file: {error}") from None
    return args.token or os.environ.get("COOP_TOKEN") or None


def _serve(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    large_allocations_off_the_heaps()  # a coordinator's freed buffers back to the OS at once (coop.memory)
    try:
        config = load_run_config(args.config) if args.config else None
        if config is not None:  # [model] init_from: the imported weights become round 0 of a new run
            config = seed_coordinator_state(config, args.state_dir)
        coordinator = Coordinator(config, args.state_dir, run_token=_read_token(args))
    except (ConfigError, ValueError, FileNotFoundError) as error:
        print(f"coop-coordinator: {error}", file=sys.stderr)
        return 2
    if coordinator.run_token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("no --token: anyone who can reach %s:%d can join and send updates", args.host, args.port)
    app = create_app(coordinator, _upload_port(args))
    scheme = "https" if args.ssl_certfile else "http"
    log.info("coordinator for %.2fM parameters at %s://%s:%d (round %d of %d); state in %s",
             coordinator.n_params / 1e6, scheme, args.host, args.port, coordinator.machine.number,
             coordinator.config.rounds.max_rounds, args.state_dir)
    limits = coordinator.config.coordinator
    uv_config = server_config(app, args.host, args.port, max_connections=limits.max_connections,
                              keep_alive_s=limits.keep_alive_s, header_timeout_s=limits.header_timeout_s,
                              log_level=args.log_level, ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile,
                              access_log=args.log_level == "debug")
    server = ExitingServer(uv_config, coordinator, args.exit_when_done)
    server.run()
    return 0


def _upload_port(args) -> UploadPort | None:
    if args.upload_port is not None and args.upload_port <= 0:
        return None
    # by default the API's port + 1 (--port 0, any free one: then any free one too)
    port = args.upload_port if args.upload_port is not None else args.port + 1 if args.port else 0
    context = None
    if args.ssl_certfile:  # the uploads as private as the API
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    return UploadPort(args.host, port, context)


class ExitingServer(uvicorn.Server):
    """uvicorn's server, stopping itself `exit_after` seconds after the run is done (if given)."""

    def __init__(self, config: uvicorn.Config, coordinator, exit_after: float | None):
        super().__init__(config)
        self.coordinator, self.exit_after = coordinator, exit_after

    async def serve(self, sockets=None):
        watcher = asyncio.ensure_future(self._exit_when_done()) if self.exit_after is not None else None
        try:
            await super().serve(sockets)
        finally:
            if watcher:
                watcher.cancel()

    async def _exit_when_done(self):
        while not self.coordinator.machine.done:
            await asyncio.sleep(0.5)
        await asyncio.sleep(self.exit_after)
        self.should_exit = True


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())

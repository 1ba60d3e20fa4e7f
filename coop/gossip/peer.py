"""A peer: trains its replica, serves the peer API, and merges with a few partners every round.

    start_swarm(config, host=..., port=...)   the first peer (`coop swarm start --config run.toml`)
    join(url, args)                           any later peer, through any live peer (`coop-worker join URL`)

Threads: the main thread trains and merges (`PeerNode.run`); uvicorn serves the API from a daemon
thread (`coop.gossip.server`); a heartbeat thread exchanges member lists; pushes to partners run
in a small thread pool. Shared state is guarded by one condition variable, `PeerNode.cond`.
docs/p2p.md describes the protocol; `coop.gossip.merge` the merge rule shared with `coop simulate`.
At the end of its run a peer writes its copy of the global model to --out/model.safetensors (a
model file, coop.trained: what `coop sample` and `coop export` read).
"""
from __future__ import annotations

import argparse
import math
import os
import secrets
import signal
import socket
import sys
import threading
import time
from typing import Any

import httpx
import numpy as np

import engine
from coop import launch
from coop.data_parallel import run_rank
from coop.outer import NesterovSGD
from coop.gossip.identity import Identity, verify
from coop.gossip.membership import Membership
from coop.gossip.node import PeerState
from coop.gossip.options import build_join_parser, build_start_parser, link_from_args
from coop.gossip.payload import pack_data, parse_data, parse_state
from coop.gossip.protocol import (
    Heartbeat,
    JoinReply,
    JoinRequest,
    LeaveRequest,
    Member,
    PeerInfo,
    RoundRecord,
    signed_bytes,
)
from coop.gossip.server import ServerThread, create_app
from coop.gossip.transport import GossipTransport
from coop.init_from import load_init_from
from coop.progress import Progress
from coop.replica import Replica
from coop.round import RoundLoop
from coop.runconfig import ConfigError, RunConfig, load_run_config
from coop.streaming import fragments
from coop.throttle import Link
from coop.trained import MODEL_FILE_NAME, TrainedModel, write_model_file
from coop.training import load_weights
from coop.wire import WireError, spec_of
from engine.data import TokenDataset, encode_corpus_in_memory, tokenizer_from_json
from engine.nn import GPT

HISTORY = 1000  # rounds kept in the status history


def _default_advertise(host: str, port: int) -> str:
    return f"http://{'127.0.0.1' if host in ('', '0.0.0.0', '::') else host}:{port}"


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host if host not in ("", "::") else "0.0.0.0", 0))
        return s.getsockname()[1]


class PeerNode(PeerState):
    """A peer that trains: joins or starts a swarm, sends heartbeats, trains and merges each round."""

    server: ServerThread | None = None
    # makes the replica (Replica's signature); --gpus: coop.data_parallel's LeadingReplica
    replica_factory = Replica
    out_dir: str | None = None  # where the final model file goes (None: runs/peer-<id>)

    # ------------------------------------------------------------------------------------------
    # Setting up: a new swarm, or joining one.

    def _build(self, config: RunConfig, tokens: np.ndarray, tokenizer_json: str, init: bool,
               initial: dict[str, np.ndarray] | None = None) -> None:
        """Model, replica and data from the config and the swarm's tokens (both kinds of peer);
        `initial`: the first peer's starting weights ([model] init_from) instead of a seeded init."""
        self.tokenizer = tokenizer = tokenizer_from_json(tokenizer_json)
        data = TokenDataset(tokens, tokenizer.info())
        train, val = data.split(config.data.val_fraction)
        if min(len(train), len(val)) < config.model.block_size + 1:
            raise SystemExit(f"the corpus ({len(data)} tokens) is too small for block_size {config.model.block_size}")
        self.model_config = model_config = config.gpt_config(tokenizer.vocab_size)
        engine.manual_seed(config.seed)  # the first peer's initial weights: the same for the same config
        model = GPT(model_config)
        if initial is not None:
            load_weights(model, initial)
        # each peer samples its own batches from the whole training split, seeded by its id
        self.replica = self.replica_factory(model_config, train, config.inner_config(), self.device,
                                            seed=int(self.peer_id.encode().hex()[:15], 16) % (2**31), model=model)
        self.val_data = val
        self.config = config
        self.codec = config.codec()
        self.data_message = pack_data(tokens, tokenizer_json)
        if init:
            self.global_weights = self.replica.weights()
            self.outer = config.outer_optimizer()
        self.spec = spec_of(self.replica.weights())
        self.parts = fragments(self.spec, config.outer.fragments)

    def setup_new_swarm(self, config: RunConfig) -> None:
        """The first peer: tokenizes the corpus, initialises the weights, round 0."""
        trained = None
        try:
            if config.model.init_from:  # the directory's shape, tokenizer and weights (coop.init_from)
                config, trained = load_init_from(config)
            text = config.data.corpus_text()
        except (FileNotFoundError, ConfigError) as error:
            raise SystemExit(f"run config: {error}") from None
        tokenizer = trained.tokenizer if trained else config.data.new_tokenizer(text)
        dataset = encode_corpus_in_memory(text, tokenizer)
        self._build(config, dataset.tokens, tokenizer.to_json(), init=True, initial=trained.weights if trained else None)
        with self.cond:
            self.swarm = secrets.token_hex(8)
            self.round = 0
            self.membership = Membership(self.member_card(0, 0), config.gossip.dead_after_s)
            self.ready = True
        self.log(f"started swarm {self.swarm} at {self.advertise} "
                 f"({sum(math.prod(s.shape) for s in self.spec.values()):,} parameters)")

    def setup_from_peer(self, url: str) -> None:
        """A newcomer: join through `url`, then fetch the data and the current state from it."""
        url = url.rstrip("/")
        with self._client(60.0) as client:
            info = PeerInfo.model_validate(self._get_json(client, f"{url}/v1/info"))
            card = self.member_card(0, 0)
            request = JoinRequest(peer_id=self.peer_id, url=self.advertise, public_key=card.public_key, card=card.card)
            reply = JoinReply.model_validate(self._post_json(client, f"{url}/v1/join", request))
            # the reply's member cards are signed by their peers; the state must be signed by the one we asked
            entry = next((m for m in reply.members if m.peer_id == reply.peer_id), None)
            if entry is None or entry.peer_id != info.peer_id:
                raise SystemExit(f"{url}: its join reply does not list the peer that answered ({reply.peer_id!r:.40})")
            config = RunConfig.model_validate(reply.config)
            data_body = self._get_bytes(client, f"{url}/v1/data")
            tokens, tokenizer_json = parse_data(data_body, max_bytes=1 << 34)
            self._build(config, tokens, tokenizer_json, init=False)
            state_body = self._get_bytes(client, f"{url}/v1/state")
        limit = 2 * sum(4 * math.prod(s.shape) for s in self.spec.values()) + (1 << 20)
        try:
            round_index, weights, outer_state, _ = parse_state(state_body, self.spec, max_bytes=limit,
                                                               public_key=entry.public_key)
        except WireError as error:
            raise SystemExit(f"{url}/v1/state: {error}") from None
        outer = NesterovSGD()
        outer.load_state_dict(outer_state)
        with self.cond:
            self.swarm = reply.swarm
            self.global_weights, self.outer = weights, outer
            self.round = round_index
            self.inbox.close(round_index - 1) if round_index > 0 else None
            self.membership = Membership(self.member_card(reply.active_from, round_index), config.gossip.dead_after_s)
            self.membership.merge([m for m in reply.members if m.peer_id != self.peer_id])
            self.membership.heard_from(info.peer_id)
            self.bytes_received += len(data_body) + len(state_body)
            self.ready = True
        self.log(f"joined swarm {reply.swarm} through {url} at round {round_index} (in groups from round "
                 f"{reply.active_from}); {len(reply.members)} members")

    def _get_json(self, client: httpx.Client, url: str) -> Any:
        response = client.get(url)
        self._raise_for(response, url)
        return response.json()

    def _post_json(self, client: httpx.Client, url: str, message) -> Any:
        response = client.post(url, content=message.model_dump_json(), headers={"content-type": "application/json"})
        self._raise_for(response, url)
        return response.json()

    def _get_bytes(self, client: httpx.Client, url: str) -> bytes:
        response = client.get(url)
        self._raise_for(response, url)
        return response.content

    @staticmethod
    def _raise_for(response: httpx.Response, url: str) -> None:
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise SystemExit(f"{url} answered {response.status_code}: {detail}")

    # ------------------------------------------------------------------------------------------
    # Heartbeats.

    def heartbeat_loop(self) -> None:
        interval = self.config.gossip.heartbeat_s
        while not self.stopping.wait(interval):
            with self.cond:
                targets = self.membership.others()
                message = self._heartbeat_message().model_dump_json()
            timeout = max(2 * interval, 1.0)
            list(self.heartbeat_pool.map(self._beat, targets, [message] * len(targets), [timeout] * len(targets)))
            with self.cond:
                for pid in self.membership.sweep():
                    self.log(f"dropped member {pid}: no contact for {self.membership.dead_after:g}s")
                self.cond.notify_all()

    def _beat(self, member: Member, message: str, timeout: float) -> None:
        """One heartbeat to one member; its reply counts as contact and brings its member list."""
        try:
            with self._client(timeout) as client:  # one client per call: clients are not shared between threads
                response = client.post(f"{member.url}/v1/heartbeat", content=message,
                                       headers={"content-type": "application/json"})
            if response.status_code != 200:
                return
            reply = Heartbeat.model_validate_json(response.content)
        except (httpx.HTTPError, ValueError):
            return
        if (reply.swarm != self.swarm or reply.peer_id != member.peer_id
                or not verify(member.public_key, "heartbeat", signed_bytes(reply), reply.signature)):
            return  # not the member we know (another key), or not signed: no contact
        with self.cond:
            self.membership.heard_from(member.peer_id, reply.round)
            for pid in self.membership.merge(reply.members):
                self.log(f"learned of member {pid} from {member.peer_id}")

    # ------------------------------------------------------------------------------------------
    # One round's exchange and merge.

    # ------------------------------------------------------------------------------------------
    # The loop.

    def wait_for_peers(self, count: int) -> None:
        with self.cond:
            self.phase = "waiting"
            if count > 1:
                self.log(f"waiting for {count - 1} more peer(s) to join before round 0")
            while len(self.membership.members) < count and not self.stopping.is_set():
                self.cond.wait(0.5)

    def run(self) -> None:
        """The round loop (coop.round) over the gossip transport, until the last round or a stop."""
        rounds = self.config.rounds
        progress = Progress(total=rounds.max_rounds, start=self.round, quiet=self.quiet, unit="round",
                            steps_per_point=self.config.round_steps)
        self.replica.step_callback = progress.step  # the line moves within a round too
        if rounds.eval_every:  # the starting point, so that "the loss fell" can be read off the status
            self.initial_val = self.replica.evaluate_weights(self.global_weights, self.val_data, rounds.eval_batches)
        loop = RoundLoop(self.replica, self.codec, GossipTransport(self), self.config.round_steps)
        while True:
            started = time.perf_counter()
            report = loop.run_round()
            if report is None:
                break
            self._record(report, started, progress)
        with self.cond:
            self.phase = "done" if not self.stopping.is_set() else "stopped"
        first = self.initial_val
        progress.note(f"peer {self.peer_id}: finished at round {self.round}; val loss "
                      f"{first if first is None else round(first, 3)} -> "
                      f"{self.last_val if self.last_val is None else round(self.last_val, 3)}; "
                      f"sent {self.bytes_sent / 1e6:.1f} MB, received {self.bytes_received / 1e6:.1f} MB")

    def _record(self, report, started: float, progress: Progress) -> None:
        """After one round: the val loss every eval_every rounds, the history, the status, the progress line."""
        rounds, result, round_index = self.config.rounds, report.result, report.round
        partners, received, cd, next_round = report.outcome
        val_loss = None
        if rounds.eval_every and (round_index + 1) % rounds.eval_every == 0:
            val_loss = self.replica.evaluate_weights(self.global_weights, self.val_data, rounds.eval_batches)
        record = RoundRecord(round=round_index, loss=result.mean_loss if math.isfinite(result.mean_loss) else None,
                             val_loss=val_loss, consensus_distance=cd, partners=partners, received_from=received,
                             seconds=time.perf_counter() - started)
        with self.cond:
            record.bytes_sent, record.bytes_received = self.bytes_sent, self.bytes_received
            self.history = (self.history + [record])[-HISTORY:]
            self.last_loss = record.loss
            self.last_val = val_loss if val_loss is not None else self.last_val
            self.last_cd = cd if cd is not None else self.last_cd
            self.tokens_per_second = result.tokens / max(result.seconds, 1e-9)
            members = len(self.membership.members)
            sent, got = self.bytes_sent, self.bytes_received
        cd_text = f"{cd:.4f}" if cd is not None else "-"
        val_text = f"  val {val_loss:.3f}" if val_loss is not None else ""
        progress.update(min(next_round, progress.total), f"round {round_index} loss {result.mean_loss:.3f}{val_text}  "
                        f"members {members} group {1 + len(received)}/{1 + len(partners)}  cd {cd_text}  "
                        f"sent {sent / 1e6:.1f} MB recv {got / 1e6:.1f} MB", tokens=result.tokens)

    # ------------------------------------------------------------------------------------------
    # Lifetime.

    def serve(self, host: str, port: int) -> None:
        self.server = ServerThread(create_app(self), host, port)
        self.server.start()

    def start_heartbeats(self) -> None:
        self.heartbeat_thread = threading.Thread(target=self.heartbeat_loop, name="peer-heartbeat", daemon=True)
        self.heartbeat_thread.start()

    def save_model(self) -> str | None:
        """Write this peer's copy of the global model as a model file (coop.trained); returns its path."""
        with self.cond:
            weights = {name: array.copy() for name, array in self.global_weights.items()}
            round_index = self.round
        trained = TrainedModel(weights, self.model_config, self.tokenizer,
                               f"peer {self.peer_id} of swarm {self.swarm}", round_index)
        path = os.path.join(self.out_dir or f"runs/peer-{self.peer_id}", MODEL_FILE_NAME)
        try:
            write_model_file(path, trained)
        except OSError as error:  # the run is done all the same; say so and leave cleanly
            self.log(f"could not write the final model to {path} ({error}); pass --out DIR with room to write")
            return None
        self.log(f"final model (round {round_index}) written to {path}: `coop sample {path}`")
        return path

    def leave(self, keep_serving: bool = False) -> None:
        """Tell the others we are going (best effort), then stop serving (unless `keep_serving`:
        status and state stay readable, updates and joins get 410)."""
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()
            others = self.membership.others() if self.membership else []
            message = self.sign_message(LeaveRequest(swarm=self.swarm, peer_id=self.peer_id,
                                                     signature="0" * 128)).model_dump_json()
        with self._client(2.0) as client:
            for member in others:
                try:
                    client.post(f"{member.url}/v1/leave", content=message, headers={"content-type": "application/json"})
                except httpx.HTTPError:
                    pass
        if self.heartbeat_thread is not None:
            self.heartbeat_thread.join(5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.heartbeat_pool.shutdown(wait=False, cancel_futures=True)
        if self.server is not None and not keep_serving:
            self.server.stop()


# ----------------------------------------------------------------------------------------------
# Entry points.


def _serve_and_run(node: PeerNode, setup, host: str, port: int, wait_peers: int = 1, linger: float = 0.0) -> int:
    node.serve(host, port)
    try:
        setup()
        node.start_heartbeats()
        node.wait_for_peers(wait_peers)
        node.run()
        node.save_model()
        node.leave(keep_serving=linger > 0)
        if linger > 0:  # status and final weights stay readable (GET /v1/status, /v1/state)
            time.sleep(linger)
            node.server.stop()
    except KeyboardInterrupt:
        node.log("interrupted; leaving the swarm")
        node.leave()
        return 130
    return 0


def load_identity(key_path: str | None, peer_id: str | None) -> Identity:
    """The peer's key (`--key`: kept in that file, made there the first time; else a new one).
    The id is derived from the key: `--peer-id` can only confirm it, never choose it."""
    identity = Identity.load_or_create(key_path)
    if peer_id and peer_id != identity.peer_id:
        raise SystemExit(f"--peer-id {peer_id!r:.40}: a peer's id is derived from its key, and this key's id is "
                         f"{identity.peer_id}; drop --peer-id, or pass --key with the key of that id")
    return identity


def start_swarm(config: RunConfig, *, host: str = "127.0.0.1", port: int = 8500, token: str | None = None,
                advertise: str | None = None, device: str = "cpu", wait_peers: int = 1, quiet: bool = False,
                identity: Identity | None = None, linger: float = 0.0, link: Link | None = None,
                out: str | None = None, replica_factory=None) -> int:
    """Run the first peer of a new swarm until `config.rounds.max_rounds` rounds are done (or Ctrl-C);
    its final model goes to `out`/model.safetensors."""
    port = port or _free_port(host)
    node = PeerNode(token=token, advertise=advertise or _default_advertise(host, port), device=device, quiet=quiet,
                    identity=identity, link=link)
    node.out_dir = out
    if replica_factory is not None:
        node.replica_factory = replica_factory
    return _serve_and_run(node, lambda: node.setup_new_swarm(config), host, port, wait_peers, linger)


def join(url: str, args: argparse.Namespace) -> int:
    """Join the swarm that the peer at `url` is in and train with it (what `coop-worker join URL`
    calls when URL answers {"kind": "peer"}). Reads from `args`: token, device, host, port,
    advertise, key, peer_id (each optional)."""
    host = getattr(args, "host", None) or "127.0.0.1"
    port = getattr(args, "port", None) or _free_port(host)
    advertise = getattr(args, "advertise", None) or _default_advertise(host, port)
    node = PeerNode(token=getattr(args, "token", None), advertise=advertise, device=getattr(args, "device", None) or "cpu",
                    quiet=bool(getattr(args, "quiet", False)),
                    identity=load_identity(getattr(args, "key", None), getattr(args, "peer_id", None)),
                    link=link_from_args(args))
    node.out_dir = getattr(args, "out", None)
    if getattr(args, "replica_factory", None) is not None:  # coop-worker join --gpus: data parallel (rank 0)
        node.replica_factory = args.replica_factory
    return _serve_and_run(node, lambda: node.setup_from_peer(url), host, port,
                          linger=float(getattr(args, "linger", 0) or 0))


def _sigterm_as_interrupt(signum, frame):  # docker stop / kubectl delete: leave cleanly, like Ctrl-C
    raise KeyboardInterrupt


def start_from_args(args: argparse.Namespace) -> int:
    """`coop swarm start` with its parsed options (coop.gossip.options)."""
    try:
        config = load_run_config(args.config) if args.config else RunConfig()
    except ConfigError as error:
        print(f"coop swarm start: {error}", file=sys.stderr)
        return 2
    if problem := launch.launch_problem("coop swarm start", args):
        print(problem, file=sys.stderr)
        return 2
    if launch.wants_launch(args):  # --gpus: one rank per GPU; rank 0 is the peer, the others follow it
        module, argv = ("coop.cli", args.argv) if hasattr(args, "argv") else ("coop.gossip.peer", sys.argv[1:])
        return launch.launch("coop swarm start", module, argv, args)
    place = launch.current_rank()
    if place is not None:
        args.device = place.device

    def start(replica_factory=None) -> int:
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        return start_swarm(config, host=args.host, port=args.port, token=args.token or os.environ.get("COOP_TOKEN"),
                           advertise=args.advertise, device=args.device, wait_peers=args.wait_peers,
                           quiet=args.quiet, identity=load_identity(args.key, args.peer_id), linger=args.linger,
                           link=link_from_args(args), out=args.out, replica_factory=replica_factory)

    if place is None:
        return start()
    return run_rank("coop swarm start", place, start, counts_all_ranks=False)


def start_main(argv: list[str] | None = None) -> int:
    """`coop swarm start [--config run.toml] [--port 8500] [--token T] [--wait-peers N]` as a function."""
    return start_from_args(build_start_parser().parse_args(argv))


def join_main(argv: list[str] | None = None) -> int:
    """`python -m coop.gossip.peer join URL ...`: what `coop-worker join URL` does for a peer's URL."""
    args = build_join_parser().parse_args(argv)
    args.token = args.token or os.environ.get("COOP_TOKEN")
    return join(args.url, args)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "start":
        return start_main(argv[1:])
    if argv and argv[0] == "join":
        return join_main(argv[1:])
    print("usage: python -m coop.gossip.peer start [--config run.toml] ... | join URL ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

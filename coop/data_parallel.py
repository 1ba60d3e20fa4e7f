"""A DiLoCo replica spread over the GPUs of one worker: rank 0 leads, the other ranks follow.

Rank 0 runs the worker or the peer as usual (it alone talks to the coordinator or the swarm);
its replica is a `LeadingReplica`: every inner step is one data-parallel step over all ranks
(engine.nn.parallel.DistributedDataParallel: each rank its own batch of the shard, gradients
averaged), and whatever changes the weights outside a step (a merge arriving) is broadcast from
rank 0. The other ranks run `follow()`: they hold a replica of their own and do what rank 0's
commands say, one command at a time through the launcher's store:

    build   model / inner config and seed: make the replica (its batch RNG seeded per rank)
    data    the shard (tokens through the store): train on it
    wrap    wrap the model in DistributedDataParallel (parameters broadcast from rank 0)
    sync    receive the weights from rank 0 (after a merge)
    step    one inner step at schedule position `step`
    stop    the run is over

Every rank takes the same steps on the same averaged gradients, so all hold the same weights and
optimizer state; rank 0's pseudo-gradient is the worker's, and its `tokens` the sum over ranks
(K x B x T x world size; the coordinator allows that to a worker that joined with `--gpus`). In a
swarm the receiving peers cap an update at K x B x T, so there a peer's update counts one GPU's
tokens (counts_all_ranks=False) until peers announce their GPUs. A rank that dies ends the others through the process group
(RankDiedError) and the launcher (coop.launch)."""
from __future__ import annotations

import json

import numpy as np

import engine
import engine.distributed as dist
from engine.data import TokenDataset
from engine.nn import GPTConfig
from engine.nn.parallel import DistributedDataParallel

from .launch import RankPlace, init_rank_group
from .replica import InnerConfig, Replica, RoundResult

_COMMAND_PREFIX = "coop/command/"


class Commands:
    """Rank 0's commands to the other ranks, numbered, as small JSON values in the store."""

    def __init__(self, group: dist.ProcessGroup):
        self.group, self.store, self.count = group, group.store, 0

    def _key(self) -> str:
        return f"{_COMMAND_PREFIX}{self.count}"

    def send(self, op: str, **fields) -> None:
        self.store.set(self._key(), json.dumps({"op": op, **fields}).encode())
        self.count += 1

    def receive(self) -> dict:
        """The next command; waits for as long as rank 0 lives (it may wait for a round's merge)."""
        key = self._key()
        command = json.loads(self.store.get(key, timeout=None))
        if self.store.add(f"{key}/read") == self.group.world_size - 1:  # the last reader cleans up
            self.store.delete(key)
            self.store.delete(f"{key}/read")
        self.count += 1
        return command

    def send_data(self, data: TokenDataset) -> None:
        key = f"{_COMMAND_PREFIX}data{self.count}"
        tokens = np.ascontiguousarray(data.tokens)
        self.store.set(key, tokens.tobytes())
        self.send("data", key=key, dtype=tokens.dtype.str, tokenizer=data.tokenizer_info)

    def receive_data(self, command: dict) -> TokenDataset:
        key = command["key"]
        tokens = np.frombuffer(self.store.get(key, timeout=None), dtype=np.dtype(command["dtype"]))
        if self.store.add(f"{key}/read") == self.group.world_size - 1:
            self.store.delete(key)
            self.store.delete(f"{key}/read")
        return TokenDataset(tokens, command["tokenizer"])


def _wrap(replica: Replica, group: dist.ProcessGroup) -> None:
    """The replica's steps through DistributedDataParallel (its TrainStep, and so its CUDA graph)."""
    replica.ddp = DistributedDataParallel(replica.model, group)
    replica.train_step_fn.model = replica.ddp


def _sync_weights(replica: Replica, group: dist.ProcessGroup) -> None:
    with engine.no_grad():
        for p in replica.model.parameters():
            group.broadcast(p, 0)


def rank_seed(seed: int, rank: int) -> int:
    """Rank r's batch RNG (and initial-weight) seed: rank 0 keeps the replica's own."""
    return seed + 1_000_003 * rank


class LeadingReplica(Replica):
    """Rank 0's replica (the module docstring says how it leads)."""

    def __init__(self, model_config: GPTConfig, data: TokenDataset, inner: InnerConfig | None = None,
                 device: str = "cpu", seed: int = 0, model=None, graph: bool | None = None, *,
                 counts_all_ranks: bool = True):
        self.group = dist.get_group()
        self.counts_all_ranks = counts_all_ranks
        self.commands = Commands(self.group)
        self.commands.send("build", model=model_config.to_dict(), inner=(inner or InnerConfig()).to_dict(),
                           seed=int(seed), graph=graph)
        super().__init__(model_config, data, inner, device, seed, model, graph)  # (sets .data: sent)
        self.commands.send("wrap")
        _wrap(self, self.group)

    @property
    def data(self) -> TokenDataset:
        return self._data

    @data.setter
    def data(self, value: TokenDataset) -> None:  # a worker that rejoins gets a new shard: so do the others
        self._data = value
        self.commands.send_data(value)

    def train_step(self) -> engine.Tensor:
        self.commands.send("step", step=self.step)
        return super().train_step()

    def apply_merge(self, global_weights: dict[str, np.ndarray], keep_progress: bool = False,
                    merge_round: int | None = None) -> None:
        super().apply_merge(global_weights, keep_progress, merge_round)
        self.commands.send("sync")
        _sync_weights(self, self.group)

    def step_eagerly(self, merge_round: int | None) -> None:
        if self.eager is None or merge_round is None:
            return
        super().step_eagerly(merge_round)  # the other ranks train from the same guess
        self.commands.send("sync")
        _sync_weights(self, self.group)

    def run_round(self, *args, **kwargs) -> RoundResult | None:
        result = super().run_round(*args, **kwargs)
        if result is not None and self.counts_all_ranks:
            result.tokens *= self.group.world_size  # every rank's batches went into this update
        return result

    def stop_followers(self) -> None:
        """The run is over: the other ranks leave their loop (idempotent)."""
        if not getattr(self, "_stopped", False):
            self._stopped = True
            self.commands.send("stop")


def follow(group: dist.ProcessGroup, device: str) -> int:
    """A rank other than 0: do rank 0's commands until it says stop (0) or dies (RankDiedError)."""
    commands = Commands(group)
    replica: Replica | None = None
    while True:
        command = commands.receive()
        op = command["op"]
        if op == "build":
            seed = rank_seed(int(command["seed"]), group.rank)
            replica = Replica(GPTConfig.from_dict(command["model"]), None, InnerConfig(**command["inner"]),
                              device=device, seed=seed, graph=command["graph"])
        elif op == "data":
            replica.data = commands.receive_data(command)
        elif op == "wrap":
            _wrap(replica, group)
        elif op == "sync":
            _sync_weights(replica, group)
        elif op == "step":
            replica.step = int(command["step"])
            replica.train_step()
        elif op == "stop":
            return 0
        else:
            raise dist.DistributedError(f"rank {group.rank}: unknown command {op!r} from rank 0 (a different coop "
                                        "version?)")


__all__ = ["Commands", "LeadingReplica", "follow", "rank_seed"]


def run_rank(command: str, place: RankPlace, lead, counts_all_ranks: bool = True) -> int:
    """A rank's whole life in a command started by coop.launch: join the process group; rank 0 runs
    `lead(replica_factory)` (the command's normal work, its replicas made by the factory: leading
    ones), the others follow; a failed process group is one clear line and exit status 1."""
    try:
        group = init_rank_group(place)
    except dist.DistributedError as error:
        print(f"{command}: rank {place.rank}: {error}", flush=True)
        return 1
    made: list[LeadingReplica] = []

    def replica_factory(*args, counts_all_ranks: bool = counts_all_ranks, **kwargs) -> LeadingReplica:
        replica = LeadingReplica(*args, counts_all_ranks=counts_all_ranks, **kwargs)
        made.append(replica)
        return replica

    try:
        if place.rank == 0:
            try:
                return lead(replica_factory)
            finally:
                for replica in made:
                    try:
                        replica.stop_followers()
                    except dist.DistributedError:
                        pass  # the store is gone: the followers end through the launcher
        return follow(group, place.device)
    except dist.DistributedError as error:
        print(f"\n{command}: rank {place.rank}: {error}", flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        try:
            dist.destroy_process_group()
        except dist.DistributedError:
            pass

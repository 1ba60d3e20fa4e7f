"""The coordinator: global weights, outer optimizer, aggregation, membership and persistence
around the round state machine (app.py, the FastAPI app, is a thin layer over this).

Concurrency: one asyncio event loop. Decoding an update (CPU-bound) runs in a thread without the
lock; everything that changes state (aggregating an update, closing a round, recording a val loss)
runs under one asyncio lock, with its numerical work in a thread so that heartbeats and long-polls
stay served. The coordinator never runs the model: the workers report the val loss (evaluation.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

import engine
from coop.diloco import Aggregator, PreparedUpdate, global_norm, shapes_of
from coop.memory import give_back_free_memory
from coop.replica import weights_of
from coop.runconfig import RunConfig
from coop.spool import MemoryBudget, Spool, SpooledBody
from coop.streaming import fragment_of_round, fragments
from coop.wire import spec_of
from engine.nn import GPT

from .data import RunData, prepare_data
from .downlink import Downlink
from .evaluation import EvalReport, ValLosses, latest_val
from .members import JoinRateLimiter, Members, WorkerRecord, retry_after_header, tokens_equal
from .metrics import CoordinatorMetrics
from .persist import Checkpointer
from .status import status_of
from .rounds import DeadlinePolicy, Phase, Report, RoundMachine, StaleRound
from .state import load_run, make_private_dir, make_private_tree, save_members, save_round
from .served import NextBody, body_of, copy_into, lay_out_weights
from .updates import RequestError, decode_upload, default_update_limit, ram_budget_bytes, spool_full

log = logging.getLogger("coop.coordinator")


class Coordinator:
    def __init__(self, config: RunConfig | None, state_dir: str | Path, run_token: str | None = None, clock=time.time):
        """`config` None: resume with the config saved in `state_dir`."""
        self.state_dir = Path(state_dir)
        make_private_dir(self.state_dir)  # token digests and the model: for the operator's eyes only
        self.run_token = run_token or None
        self.clock = clock
        self.started_at = clock()
        saved = load_run(self.state_dir)
        if saved is not None:
            stored = RunConfig.model_validate(saved.config)
            config = stored if config is None else self._reconcile(config, stored)
        elif config is None:
            raise ValueError(f"{self.state_dir} holds no run yet; give a run config (--config run.toml) to start one")
        self.config = config
        self.data: RunData = prepare_data(config.data, self.state_dir / "data", config.model.block_size)
        make_private_tree(self.state_dir / "data")
        self.model_config = config.gpt_config(self.data.vocab_size)
        self.outer = config.outer_optimizer()
        now = clock()
        if saved is None:
            engine.manual_seed(config.seed)
            self.weights = weights_of(GPT(self.model_config))
            give_back_free_memory()  # the model's parameters, freed in the heaps, before the body is laid out
            self.history: list[dict[str, Any]] = []
            self.members = Members(config.data.shards)
            first_round = 0
        else:
            self.weights = saved.weights
            self.outer.load_state_dict(saved.outer_state)
            # hyper-parameters come from the (possibly edited) config; the momentum and step count from the state
            self.outer.take_hyperparameters(config.outer_optimizer())
            self.history = saved.history
            self.members = Members.from_json(saved.members, now) if saved.members else Members(config.data.shards)
            first_round = saved.round
        self.specs = spec_of(self.weights)
        self.laid = lay_out_weights(self.specs, self.model_config, first_round)  # the weights: views of the body served
        self.weights = copy_into(self.laid.tensors, self.weights)
        self.next_body = NextBody(lambda r: lay_out_weights(self.specs, self.model_config, r))  # the close's out
        self.shapes = shapes_of(self.weights)
        self.n_params = sum(a.size for a in self.weights.values())
        self.max_update_bytes = config.coordinator.max_update_bytes or default_update_limit(self.n_params, len(self.weights))
        self.max_tokens = config.round_steps * config.inner.batch_size * config.model.block_size
        c = config.coordinator
        # streaming DiLoCo: round r takes fragment r mod P (coop.streaming); P = 1 is the whole model
        self.parts = fragments(self.weights, config.outer.fragments)
        self.part_shapes = [{n: self.shapes[n] for n in part} for part in self.parts]
        self.part_specs = [spec_of({n: self.weights[n] for n in part}) for part in self.parts]
        # uploads and the robust rules' kept updates: in RAM while they fit the budget, else in the spool
        self.spool, self.budget = Spool(self.state_dir / "spool"), MemoryBudget(ram_budget_bytes(c.ram_for_updates_mb))
        log.info("uploads and kept updates in RAM up to %.0f MB, then in %s", self.budget.limit / 1e6, self.spool.directory)
        self.aggregators = [Aggregator(shapes, **c.aggregator_options(), spool=self.spool, budget=self.budget)
                            for shapes in self.part_shapes]
        k = config.compression  # the compressed downlink keeps the workers' view (V = G on a restart)
        self.downlink = Downlink(k.codec, k.options, self.weights, k.snapshot_every,
                                 lambda r: lay_out_weights(self.specs, self.model_config, r), first_round) \
            if k.downlink == "codec" else None
        self.machine = RoundMachine(first_round, config.rounds.max_rounds, c.min_workers, c.quorum_fraction,
                                    DeadlinePolicy(c.deadline_factor, c.min_deadline_s, c.max_deadline_s), now)
        self.metrics = CoordinatorMetrics()
        self.totals = {"bytes_in": 0, "bytes_out": 0, "updates_accepted": 0, "updates_rejected": 0}
        self._round_bytes_in = 0
        # the workers' val loss reports, filed in the history's records (never computed here)
        self.val = ValLosses(config, self.data, self.history, self.state_dir, self.metrics,
                             saved.evals if saved is not None else None)
        self.join_limiter = JoinRateLimiter(c.joins_per_minute)
        self.uploading: set[str] = set()  # workers with an upload in flight: one each at a time
        self._pruned_at = 0.0
        self._members_dirty = False  # joins and leaves are written by the ticker, at most once a tick
        if saved is None:
            # the starting point of the loss curve: its val loss comes from the workers' round-0 reports
            self.history.append({"round": None, "outer_steps": 0})
            save_round(self.state_dir, round_number=0, weights=self.weights, outer_state=self.outer.state_dict(),
                       history=self.history, config=self.config.model_dump())
            save_members(self.state_dir, self.members.to_json())
        else:
            log.info("resumed from %s at round %d (%d workers known)", self.state_dir, first_round,
                     len(self.members.workers))
        self.weights_body = body_of(self.laid, self.downlink and self.downlink.laid)
        self.checkpointer = Checkpointer(self.state_dir)
        self.metrics.round.set(self.machine.number)
        # created on the event loop in start()
        self._lock: asyncio.Lock | None = None
        self._round_event: asyncio.Event | None = None
        self.upload_slots: asyncio.Semaphore | None = None
        self._ticker: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        give_back_free_memory()  # the model's initialisation left its temporaries in the heaps (coop.memory)

    @property
    def fragment(self) -> int:  # the fragment the open round merges (0 without streaming)
        return fragment_of_round(self.machine.number, len(self.parts))

    @property
    def aggregator(self) -> Aggregator:  # the open round's (one per fragment, kept for the run)
        return self.aggregators[self.fragment]

    # -- set-up -----------------------------------------------------------------------------------
    @staticmethod
    def _reconcile(given: RunConfig, saved: RunConfig) -> RunConfig:
        """Resuming: model, data and seed must match the saved run; rounds, [coordinator] and optimizers may change."""
        if given.training_identity() != saved.training_identity():
            diff = [k for k in ("seed", "model", "data") if given.training_identity()[k] != saved.training_identity()[k]]
            raise ValueError(f"the state directory holds a run with another {' and '.join(diff)} than the config given; "
                             "use the same config to resume, or a new --state-dir for a new run")
        return given

    async def start(self) -> None:
        self._lock = asyncio.Lock()
        self._round_event = asyncio.Event()
        self.upload_slots = asyncio.Semaphore(self.config.coordinator.concurrent_uploads)
        self._wake = asyncio.Event()
        self._ticker = asyncio.create_task(self._tick_forever())
        self.next_body.prepare(self.machine.number + 1)

    async def stop(self) -> None:
        if self._ticker:
            self._ticker.cancel()
        await self.checkpointer.written()
        self.val.flush()

    async def _tick_forever(self) -> None:
        """Closes rounds: on a timer (deadlines, workers timing out) and when woken by an upload,
        so that the upload's reply does not wait for the outer step and the checkpoint."""
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)
            self._wake.clear()
            try:
                self._prune_gone()
                self.flush_members()
                self.val.flush()
                async with self._lock:
                    await self._maybe_close()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the ticker die: log and keep the run going
                log.exception("round ticker failed")

    # -- membership -------------------------------------------------------------------------------
    def flush_members(self) -> None:
        """Write members.json if joins or leaves changed it (from the event loop, like every write
        of it). A join flood thus costs one write a tick, not one per join; a SIGKILL loses at most
        the last tick's joins, whose workers get a 401 and join again."""
        if not self._members_dirty:
            return
        self._members_dirty = False
        try:
            save_members(self.state_dir, self.members.to_json())
        except OSError as error:
            self._members_dirty = True
            log.error("could not write members.json (%s); will retry", error)

    def _prune_gone(self) -> None:
        """Once a second: forget workers that joined, never had an update accepted, and were not
        seen for worker_timeout_s (or left): what a join flood leaves behind."""
        now = self.clock()
        if now - self._pruned_at < 1.0:
            return
        self._pruned_at = now
        dropped = self.members.prune(now, self.config.coordinator.worker_timeout_s, keep=set(self.machine.round.reports))
        if dropped:
            self._members_dirty = True
            log.info("forgot %d workers that never contributed and are gone (%s%s)", len(dropped),
                     ", ".join(dropped[:5]), " ..." if len(dropped) > 5 else "")

    def check_run_token(self, given: str | None) -> None:
        if self.run_token is None:
            return
        if given is None or not tokens_equal(given, self.run_token):
            raise RequestError(401, "this coordinator needs its access token: pass --token (or COOP_TOKEN) "
                                    "as given by whoever runs it")

    def authenticate(self, token: str | None) -> WorkerRecord:
        record = self.members.authenticate(token) if token else None
        if record is None:
            raise RequestError(401, "unknown or missing worker token; join again (POST /v1/join)")
        record.seen(self.clock())
        return record

    def check_status_access(self, token: str | None) -> None:
        """With a run token, the status JSON needs it or a worker's token."""
        if self.run_token is None:
            return
        if token is not None and (tokens_equal(token, self.run_token) or self.members.authenticate(token)):
            return
        raise RequestError(401, "the status endpoint needs the run's access token or a worker token")

    def join(self, name: str, device: str) -> dict[str, Any]:
        timeout, cap = self.config.coordinator.worker_timeout_s, self.config.coordinator.max_workers
        if len(self.members.workers) >= cap:
            dropped = self.members.prune(self.clock(), timeout, keep=set(self.machine.round.reports), room_for=cap - 1)
            if dropped:
                log.info("forgot %d workers gone for over %gs (%s%s)", len(dropped), timeout,
                         ", ".join(dropped[:5]), " ..." if len(dropped) > 5 else "")
        if len(self.members.workers) >= cap:
            self.metrics.joins_refused.labels("full").inc()
            raise RequestError(503, f"the run is full ({cap} workers, max_workers); try again later",
                               headers={"Retry-After": retry_after_header(timeout)})
        record, token = self.members.join(name, device, self.clock(), self.machine.number, timeout)
        self._members_dirty = True
        self.metrics.workers_joined.inc()
        log.info("worker %s (%s, %s) joined at round %d with shard %d", record.id, record.name, record.device,
                 self.machine.number, record.shard)
        c = self.config
        return {
            "worker_id": record.id,
            "worker_token": token,
            "round": self.machine.number,
            "done": self.machine.done,
            "max_rounds": c.rounds.max_rounds,
            "inner_steps": c.inner.inner_steps,
            "fragments": c.outer.fragments,
            "overlap_steps": c.outer.overlap_steps,
            "outer": {**self.outer.hyperparameters(), "eager": c.eager_overlap},  # a worker's eager step (coop.eager)
            "inner": asdict(c.inner_config()),
            "model": asdict(self.model_config),
            "compression": c.compression.model_dump(),
            "shard": {"index": record.shard, "count": c.data.shards, "tokens": len(self.data.shard(record.shard))},
            "tokenizer": self.data.tokenizer.info(),
            "data_id": self.data.data_id,
            "heartbeat_s": c.coordinator.heartbeat_s,
            "seed": (c.seed * 1_000_003 + self.members.next_index) % 2**32,
            "max_update_bytes": self.max_update_bytes,
            # report the val loss of the weights of every `every`th round and of the final ones (GET /v1/val)
            "eval": {"every": c.rounds.eval_every, "batches": c.rounds.eval_batches},
        }

    def leave(self, record: WorkerRecord) -> None:
        record.left = True
        self._members_dirty = True
        log.info("worker %s left", record.id)

    def heartbeat(self, record: WorkerRecord) -> dict[str, Any]:
        return self.round_info(record)

    def round_info(self, record: WorkerRecord | None = None) -> dict[str, Any]:
        current = self.machine.round
        info = {"round": current.number, "phase": current.phase.value, "done": self.machine.done, "fragment": self.fragment}
        if record is not None:  # and how long it has to report before the others can close the round
            info["reported"] = record.id in current.reports
            info["deadline_in_s"] = self.machine.deadline_for(record.id, self.active_workers(), self.clock())
        return info

    # -- downloads ---------------------------------------------------------------------------------
    def count_download(self, record: WorkerRecord | None, nbytes: int, what: str) -> None:
        if record is not None:
            record.bytes_down += nbytes
        self.totals["bytes_out"] += nbytes
        self.metrics.bytes_out.labels(what).inc(nbytes)

    # -- the val loss, measured by the workers (evaluation.py) ---------------------------------------
    async def record_eval(self, worker: WorkerRecord, round_number: int, report: EvalReport) -> dict[str, Any]:
        """One worker's val loss of the weights of round r; a refused report changes nothing."""
        async with self._lock:  # a round's close appends to the history and writes it
            return self.val.record(worker.id, round_number, report, self.machine.number)

    # -- updates -----------------------------------------------------------------------------------
    def precheck_update(self, record: WorkerRecord, round_number: int) -> None:
        """Before reading a body: refuse a stale round at once (409)."""
        try:
            self.machine.check_can_report(record.id, round_number)
        except StaleRound as stale:
            self.reject(record, "stale")
            raise RequestError(409, str(stale), current_round=stale.current, reason=stale.reason) from None

    def reject(self, record: WorkerRecord | None, reason: str) -> None:
        if record is not None:
            record.rejected += 1
            if reason == "stale":
                record.stale_in_a_row += 1
                if record.stale_in_a_row == 2:
                    log.warning("worker %s (%s): 2 updates in a row came after their round closed; it is too slow "
                                "for the round deadline and contributes nothing", record.id, record.name)
        self.totals["updates_rejected"] += 1
        self.metrics.updates.labels(reason).inc()

    def decode_update(self, body: bytes | bytearray | SpooledBody, round_number: int,
                      gpus: int = 1) -> tuple[PreparedUpdate, dict]:
        """In a thread, beside the other uploads: the checked update (a worker of G GPUs may claim G x K x B x T tokens)."""
        f = fragment_of_round(round_number, len(self.parts))  # a stale round's is refused by its number anyway
        return decode_upload(body, round_number, self.aggregators[f], spec=self.part_specs[f],
                             codec=self.config.compression.codec, max_tokens=self.max_tokens * gpus,
                             max_bytes=self.max_update_bytes)

    async def submit_update(self, record: WorkerRecord, round_number: int,
                            body: bytes | bytearray | SpooledBody) -> dict[str, Any]:
        """Decode, check and count one upload (a body in memory, or spooled: read back in the decode's thread)."""
        nbytes = body.size if isinstance(body, SpooledBody) else len(body)
        try:
            update, meta = await asyncio.to_thread(self.decode_update, body, round_number, record.gpus)
        except RequestError as error:
            self.reject(record, "invalid")
            log.warning("update from %s for round %d refused (%d): %s", record.id, round_number, error.status, error.message)
            raise
        except OSError as error:  # the spool's disk (full, gone): the update is not lost on the worker's side
            self.reject(record, "unstored")
            raise spool_full(error) from None
        del body
        async with self._lock:
            self.precheck_update(record, round_number)  # the round may have closed while we decoded
            tokens = int(meta["tokens"])
            try:  # the robust rules keep the prepared copy; the streamed mean adds it up (in a thread)
                if self.aggregator.streaming:  # its sums in the next round's weights buffer (served.NextBody)
                    sums = (await self.next_body.get(round_number + 1)).flat(self.parts[self.fragment])
                    if sums is not None:
                        self.aggregator.keep_sum_in(sums)
                add = self.aggregator.add_prepared
                norm = await asyncio.to_thread(add, update, tokens) if self.aggregator.streaming else add(update, tokens)
            except ValueError as error:  # aggregator's own checks; it is unchanged
                self.reject(record, "invalid")
                raise RequestError(422, f"update refused: {error}") from None
            now = self.clock()
            seconds = now - max(self.machine.round.opened_at, record.joined_at)
            loss = meta.get("loss")
            self.machine.record(Report(record.id, tokens, loss, seconds, nbytes), round_number)
            record.count_update(round_number, tokens, nbytes, meta)
            self.totals["bytes_in"] += nbytes
            self.totals["updates_accepted"] += 1
            self._round_bytes_in += nbytes
            self.metrics.updates.labels("accepted").inc()
            self.metrics.bytes_in.inc(nbytes)
            self.metrics.tokens.inc(tokens)
            self.metrics.reports.set(len(self.machine.round.reports))
            self._wake.set()  # the ticker checks whether the round can close now
            return {"accepted": True, "round": round_number, "norm": norm, "reports": len(self.machine.round.reports)}

    # -- closing a round -----------------------------------------------------------------------------
    def active_workers(self) -> set[str]:
        return self.members.active(self.clock(), self.config.coordinator.worker_timeout_s)

    async def _maybe_close(self) -> None:
        """Under the lock: close the open round if its rule says so."""
        active = self.active_workers()
        self.metrics.workers_active.set(len(active))
        reason = self.machine.close_reason(self.clock(), active)
        if reason is not None:
            await self._close_round(reason, len(active))

    async def _close_round(self, reason: str, active: int) -> None:
        current = self.machine.begin_aggregation()
        t0 = self.clock()
        await self.checkpointer.arrays_read()  # the last round's write: the outer step changes its momentum
        t1 = self.clock()
        try:
            laid = await self.next_body.get(current.number + 1)  # this round's is still served
            record = await asyncio.to_thread(self._aggregate, current, laid, reason, active)
        except Exception as error:
            log.error("round %d: aggregation failed (%s); reopening it without its updates", current.number, error)
            self.aggregator.reset()
            self.machine.abort_aggregation()
            return
        # open the next round and publish its body (laid out by the aggregation) with no await in
        # between: GET /v1/weights (which does not take the lock) must never pair the new round
        # number with the old body (a worker that gets such a pair gives up: "weights do not match")
        self.machine.finish(self.clock())
        self.weights_body = body_of(self.laid, self.downlink and self.downlink.laid)
        self.next_body.prepare(self.machine.number + 1)
        # what the workers wait for: the last checkpoint's write (if still going), the aggregation with the outer step
        record["close_s"] = round(self.clock() - t0, 3)
        record["close_parts_s"] = {"checkpoint_wait": round(t1 - t0, 3), "aggregate": round(self.clock() - t1, 3)}
        self.checkpointer.start(self.machine.number, self.weights, self.outer, self.history,
                                self.config.model_dump())
        # members.json only ever from the event loop, like join and leave do: from the aggregation
        # thread it raced them (one temp file: "members.json.tmp -> members.json: no such file", a 500
        # to a join; or a list serialized while a join changed it)
        self._members_dirty = True
        self.flush_members()
        self._round_bytes_in = 0
        self.metrics.round.set(self.machine.number)
        self.metrics.reports.set(0)
        self.metrics.round_seconds.observe(t0 - current.opened_at)
        self.metrics.aggregate_seconds.observe(self.clock() - t0)
        if record.get("train_loss") is not None:
            self.metrics.train_loss.set(record["train_loss"])
        log.info("round %d closed (%s): %d updates, %d tokens, train loss %s, last val loss %s", current.number,
                 reason, record["contributors"], record["tokens"], _fmt(record.get("train_loss")),
                 _fmt((latest_val(self.history) or {}).get("loss")))
        if self.machine.done:
            log.info("run done: %d rounds", self.machine.number)
        event, self._round_event = self._round_event, asyncio.Event()
        event.set()

    def _aggregate(self, current, laid, reason: str, active: int) -> dict[str, Any]:
        """In a thread: outer step and history (no evaluation: the workers report it; the checkpoint
        is written once the next round is open, coop.coordinator.persist). Raises
        (state untouched) if the aggregate is unusable; the weights only change once outer.step has checked it."""
        part, moved = self.parts[self.fragment], laid.tensors
        # the aggregate goes into the new buffer (where the part lies in it back to back; the streamed
        # mean's sums are there already), the step overwrites it there
        pseudo_grad = self.aggregator.result(out=laid.flat(part))
        pseudo_grad_norm = global_norm(pseudo_grad)  # before the step overwrites it
        lr = self.outer.current_lr()
        self.outer.step({n: self.weights[n] for n in part}, pseudo_grad, out={n: moved[n] for n in part})
        copy_into({n: a for n, a in moved.items() if n not in part}, self.weights)  # other fragments
        self.laid, self.weights = laid, moved
        if self.downlink is not None:
            self.downlink.after_step(self.weights, self.parts[self.fragment], current.number + 1)
        reports = list(current.reports.values())
        losses = [(r.loss, r.tokens) for r in reports if r.loss is not None]
        record: dict[str, Any] = {
            "round": current.number,
            "outer_steps": current.number + 1,
            "reason": reason,
            "fragment": self.fragment,
            "contributors": len(reports),
            "active": active,
            "workers": sorted(r.worker_id for r in reports),
            "tokens": sum(r.tokens for r in reports),
            "train_loss": sum(loss * t for loss, t in losses) / sum(t for _, t in losses) if losses else None,
            "pseudo_grad_norm": pseudo_grad_norm,
            "update_norm_mean": float(np.mean(self.aggregator.norms)),
            "outer_lr": lr,
            "bytes_in": self._round_bytes_in,
            "duration_s": round(self.clock() - current.opened_at, 3),
            "deadline_s": round(current.deadline_s, 3),
            "closed_at": self.clock(),
        }
        self.aggregator.reset()
        give_back_free_memory()  # the close's temporaries, before the next round's uploads come in
        self.history.append(record)
        return record

    # -- long-poll -----------------------------------------------------------------------------------
    async def wait_round_end(self, round_number: int, timeout_s: float, record: WorkerRecord | None) -> dict[str, Any]:
        """Returns when round r has closed, the run is done, timeout_s passed, or at once when the
        caller's update for the open round r is not counted (a restart lost it: it must upload again)."""
        deadline = time.monotonic() + timeout_s
        current = self.machine.round
        lost = (record is not None and current.number == round_number and current.phase is Phase.OPEN
                and record.id not in current.reports)
        while self.machine.number <= round_number and not self.machine.done and not lost:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(self._round_event.wait(), remaining)
            except asyncio.TimeoutError:
                break
        info = self.round_info(record)
        info["closed"] = self.machine.number > round_number
        return info

    # -- status ----------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return status_of(self)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"

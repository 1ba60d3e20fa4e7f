"""The val loss of the global weights, measured by the workers: the coordinator never runs the model
(on its CPU a 10.8M GPT took ~100 s an evaluation, while every worker's GPU waited).

    GET  /v1/val                a fixed slice of the val split: every worker evaluates it the same way
    POST /v1/rounds/{r}/eval    {"loss", "tokens"}: one worker's val loss of the weights of round r

The weights of round r are the global weights after r outer steps, the ones `GET /v1/weights` serves
while round r is open (r = max_rounds: the final model). Their history record is the one with
`outer_steps` = r: the initial record for r = 0, the record of round r - 1 otherwise. Workers report
every `rounds.eval_every` rounds after uploading their update, and the final weights once when the
run is done. The record keeps each worker's report (`val_reports`: id -> [loss, tokens]) and their
token-weighted mean (`val_loss`, `val_tokens`), recomputed when a late report arrives.

The slice: `rounds.eval_batches` x `inner.batch_size` x (`model.block_size` + 1) consecutive val
tokens at an offset drawn with a fixed seed. Every worker draws its windows from it with the same
seed (`coop.replica.Replica.evaluate_weights`, under its training precision), so the losses of every
worker and every round are of the same windows and comparable.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from coop.runconfig import RunConfig
from coop.wire import pack
from engine.data import TokenDataset

from .data import RunData
from .metrics import CoordinatorMetrics
from .state import save_evals
from .updates import RequestError

log = logging.getLogger("coop.coordinator")

VAL_SEED = 12345  # the slice's offset; fixed so that a restarted coordinator serves the same slice

# A model that guesses uniformly scores ln(vocab) (4.2 for 65 characters, 10.8 for GPT-2's 50257
# tokens); a mean of 100 means e^-100 on the right token: no evaluation gives that, only a report
# meant to drag the mean.
MAX_VAL_LOSS = 100.0


class EvalReport(BaseModel):
    """The body of POST /v1/rounds/{r}/eval: the mean loss over `tokens` val tokens."""

    model_config = ConfigDict(extra="forbid", strict=True)
    loss: float = Field(allow_inf_nan=False)
    tokens: StrictInt


class ValLosses:
    """The val loss side of one run: the slice served, the reports checked and filed in the history's
    records (the coordinator's own list, which its rounds append to), evals.json and the gauge."""

    def __init__(self, config: RunConfig, data: RunData, history: list[dict[str, Any]], state_dir: Path,
                 metrics: CoordinatorMetrics, saved: dict[str, Any] | None = None):
        self.rounds, self.data, self.history = config.rounds, data, history
        self.state_dir, self.metrics = state_dir, metrics
        self.batch_size, self.block_size = config.inner.batch_size, config.model.block_size
        self.max_tokens = self.rounds.eval_batches * self.batch_size * self.block_size  # what one evaluation covers
        self._body: bytes | None = None
        self._dirty = False  # evals.json is written by the ticker, at most once a tick
        restore_reports(history, saved)  # the reports that came after the last checkpoint
        self.show()

    def body(self) -> bytes:
        """GET /v1/val: {"tokens": uint16/uint32 (n,)} + metadata (start, eval_batches, data_id, tokenizer)."""
        if self._body is None:
            start, tokens = val_slice(self.data.val, self.rounds.eval_batches, self.batch_size, self.block_size)
            self._body = pack({"tokens": tokens}, {"start": start, "tokens": len(tokens), "data_id": self.data.data_id,
                                                   "eval_batches": self.rounds.eval_batches,
                                                   "tokenizer": self.data.tokenizer.info()})
        return self._body

    def record(self, worker_id: str, round_number: int, report: EvalReport, open_round: int) -> dict[str, Any]:
        """File a worker's report of the weights of round r (under the coordinator's lock). Raises
        RequestError, changing nothing, for a report that may not count."""
        try:
            check_report(report, round_number, open_round=open_round, every=self.rounds.eval_every,
                         max_rounds=self.rounds.max_rounds, max_tokens=self.max_tokens)
            record = record_for(self.history, round_number)
            if record is None:  # only a history cut short by a failed checkpoint write lacks one
                raise RequestError(409, f"the coordinator has no record of the weights of round {round_number}",
                                   reason="unknown")
            if worker_id in record.get("val_reports", {}):
                raise RequestError(409, f"worker {worker_id} already reported the val loss of round {round_number}; "
                                        "one report each", reason="duplicate")
        except RequestError as error:
            self.metrics.eval_reports.labels("refused").inc()
            log.warning("val loss report from %s for round %d refused (%d): %s", worker_id, round_number,
                        error.status, error.message)
            raise
        add_report(record, worker_id, report.loss, report.tokens)
        self._dirty = True
        self.metrics.eval_reports.labels("accepted").inc()
        self.show()
        log.debug("weights of round %d: val loss %.4f from %s (mean %.4f of %d reports)", round_number, report.loss,
                  worker_id, record["val_loss"], len(record["val_reports"]))
        return {"accepted": True, "round": round_number, "val_loss": record["val_loss"],
                "reports": len(record["val_reports"])}

    def show(self) -> None:
        """coop_val_loss: the newest recorded val loss (NaN before the first)."""
        latest = latest_val(self.history)
        self.metrics.val_loss.set(float("nan") if latest is None else latest["loss"])

    def flush(self) -> None:
        """Write evals.json if reports came (from the event loop). The checkpoint holds them too, but
        only from the next round's close on, and never the final model's."""
        if not self._dirty:
            return
        self._dirty = False
        try:
            save_evals(self.state_dir, saved_reports(self.history))
        except OSError as error:
            self._dirty = True
            log.error("could not write evals.json (%s); will retry", error)


def val_slice(val: TokenDataset, batches: int, batch_size: int, block_size: int) -> tuple[int, np.ndarray]:
    """(offset, tokens): the consecutive val tokens the workers evaluate on (all of val if it is shorter)."""
    length = min(len(val), batches * batch_size * (block_size + 1))
    start = int(np.random.default_rng(VAL_SEED).integers(0, len(val) - length + 1))
    return start, np.ascontiguousarray(val.tokens[start:start + length])


def eval_due(round_number: int, every: int, max_rounds: int) -> bool:
    """Whether the weights of round r are evaluated: every `every` rounds (0: never), and the final ones."""
    return every > 0 and (round_number % every == 0 or round_number == max_rounds)


def check_report(report: EvalReport, round_number: int, *, open_round: int, every: int, max_rounds: int,
                 max_tokens: int) -> None:
    """Raise RequestError (422, or 409 for a round whose weights do not exist yet) unless the report
    may count. Pure: changes nothing."""
    if every == 0:
        raise RequestError(422, "this run does not evaluate ([rounds] eval_every = 0); send no eval reports")
    if round_number < 0:
        raise RequestError(422, f"round {round_number}: rounds are numbered from 0")
    if round_number > open_round:
        raise RequestError(409, f"no weights of round {round_number} exist yet; the open round is {open_round}: "
                                "evaluate the weights you downloaded", current_round=open_round, reason="ahead")
    if not eval_due(round_number, every, max_rounds):
        raise RequestError(422, f"the weights of round {round_number} are not evaluated in this run: every "
                                f"{every} rounds ([rounds] eval_every) and the final ones")
    if not 0.0 <= report.loss <= MAX_VAL_LOSS:
        raise RequestError(422, f"val loss {report.loss:.6g} is outside [0, {MAX_VAL_LOSS:g}]: a cross-entropy is "
                                "non-negative, and far above ln(vocab) means the evaluation is broken")
    if not 1 <= report.tokens <= max_tokens:
        raise RequestError(422, f"the report claims {report.tokens} tokens; an evaluation of this run covers 1 to "
                                f"{max_tokens} ([rounds] eval_batches x batch_size x block_size)")


def record_for(history: list[dict[str, Any]], round_number: int) -> dict[str, Any] | None:
    """The history record of the weights of round r (the one with outer_steps r)."""
    return next((h for h in reversed(history) if h.get("outer_steps") == round_number), None)


def add_report(record: dict[str, Any], worker_id: str, loss: float, tokens: int) -> None:
    """File one worker's report in the record and recompute the token-weighted mean."""
    reports = record.setdefault("val_reports", {})
    reports[worker_id] = [float(loss), int(tokens)]
    _summarise(record)


def _summarise(record: dict[str, Any]) -> None:
    reports = record["val_reports"].values()
    total = sum(t for _, t in reports)
    record["val_tokens"] = total
    record["val_loss"] = sum(loss * t for loss, t in reports) / total


def latest_val(history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest weights with a recorded val loss: {"round": r (their outer steps), "loss", "reports"}."""
    for h in reversed(history):
        if h.get("val_loss") is not None:
            return {"round": h["outer_steps"], "loss": h["val_loss"], "reports": len(h.get("val_reports", {}))}
    return None


def saved_reports(history: list[dict[str, Any]]) -> dict[str, dict[str, list]]:
    """What evals.json keeps (the reports that came after a checkpoint was written): outer_steps -> reports."""
    return {str(h["outer_steps"]): h["val_reports"] for h in history if h.get("val_reports")}


def restore_reports(history: list[dict[str, Any]], saved: dict[str, Any] | None) -> None:
    """After a restart: the reports of evals.json over those of the checkpoint's history, where they
    are more (reports are only ever added, so the larger set is the newer)."""
    for key, reports in (saved or {}).items():
        record = record_for(history, int(key)) if key.isdigit() else None
        if record is None or not isinstance(reports, dict) or len(reports) <= len(record.get("val_reports", {})):
            continue
        record["val_reports"] = {str(w): [float(v[0]), int(v[1])] for w, v in reports.items()}
        _summarise(record)

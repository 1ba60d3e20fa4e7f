"""The coordinator's HTTP API (FastAPI). Versioned under /v1; tensors travel as safetensors bytes
(application/octet-stream), everything else as small JSON. OpenAPI docs at /docs.

    GET  /v1/info                   who is serving: {"kind": "coordinator", "version", ...} (no auth)
    POST /v1/join                   run token -> worker id, worker token, run config, shard
    GET  /v1/weights                global weights (binary), ETag "r<round>", 304 on If-None-Match;
                                    ?since=R: only the change from round R (compressed downlink)
    GET  /v1/shard                  this worker's data shard (binary)
    GET  /v1/val                    the val slice workers evaluate the global weights on (binary)
    PUT  /v1/rounds/{r}/update      an encoded pseudo-gradient for round r (binary); 409 if r is not open
    POST /v1/rounds/{r}/eval        {"loss", "tokens"}: this worker's val loss of the weights of round r
    GET  /v1/rounds/{r}/wait        long-poll until round r has closed (or timeout_s passed)
    POST /v1/heartbeat              "still here"; returns the round info
    POST /v1/leave                  the worker leaves the run
    GET  /v1/status                 the run as JSON (rounds, workers, history)
    GET  /v1/model                  the global model as one model file (binary; model_download.py)
    GET  /metrics                   Prometheus metrics (no auth)
    GET  /                          status page: HTML with SVG charts; with a run token, the workers
                                    only for the token (header, or the cookie of /login: coop.pageaccess)
    GET  /login, POST /login        the page's log-in form; POST /logout forgets it
    GET  /docs, /redoc              the API, with its assets served here (coop.apidocs)

Errors are JSON {"detail": "..."} with 400 (malformed, aborted), 401 (token; answered before the
body is read), 408 (body slower than body_timeout_s), 409 (stale round, or an upload already in
flight for this worker, an eval report for weights not served yet or a second one), 413 (too large),
422 (not an update of this model, an eval report out of range), 429 (joins too frequent), 503 (full).
Every route documents its statuses in the OpenAPI schema.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from coop import __version__
from coop.apidocs import serve_api_docs
from coop.pageaccess import PageAccess, add_login_routes
from coop.memory import uninitialised
from coop.spool import MemoryBudget, Spool, SpooledBody

from .evaluation import EvalReport
from .ingest import UploadPort, claim_upload, count_upload
from .members import WorkerRecord, bearer_token, retry_after_header
from .model_download import ModelDownload
from .page import render_page
from .served import weights_answer
from .service import Coordinator, spool_full
from .updates import RequestError

log = logging.getLogger("coop.coordinator")
OCTET = "application/octet-stream"
SPOOL_WRITE = 8 << 20  # bytes of an upload gathered before one write to its spool file


class JoinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field("worker", max_length=64)
    device: str = Field("cpu", max_length=32)


class RoundInfo(BaseModel):
    round: int
    phase: str
    done: bool
    reported: bool | None = None
    closed: bool | None = None
    fragment: int = 0  # streaming DiLoCo: the fragment the open round merges (coop.streaming)
    # to the asking worker: seconds before the round may close without it (None: it waits for it)
    deadline_in_s: float | None = None


class UpdateAccepted(BaseModel):
    accepted: bool
    round: int
    norm: float
    reports: int


class EvalAccepted(BaseModel):
    accepted: bool
    round: int
    val_loss: float  # the token-weighted mean of the reports of these weights so far
    reports: int


class ErrorBody(BaseModel):
    detail: Any  # a sentence saying what was expected and what to do (a list for a malformed query)


_MEANING = {
    304: "not modified: the weights of the round named in If-None-Match",
    400: "malformed: a body that is not what the route takes, or an aborted upload",
    401: "missing or wrong token (answered before any body is read; the connection is closed)",
    408: "the body did not arrive within [coordinator] body_timeout_s",
    409: "round r is not open, or this worker already has an upload in flight (eval: not served yet, or a second report)",
    413: "the body is over the limit",
    422: "well-formed but not acceptable (an update of another model, bad parameters)",
    429: "too many joins from this address: wait Retry-After seconds",
    503: "the run is full (max_workers): wait Retry-After seconds",
}


def responses(*codes: int, ok: dict[str, Any] | None = None) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route: what it answers besides its 200 (checked against what
    the routes really answer by tests/coop/test_http_fuzz.py)."""
    out: dict[int | str, dict[str, Any]] = {200: ok} if ok else {}
    for code in codes:
        out[code] = {"description": _MEANING[code]} if code == 304 else {"model": ErrorBody, "description": _MEANING[code]}
    return out


def binary(description: str) -> dict[str, Any]:
    return {"description": description, "content": {OCTET: {"schema": {"type": "string", "format": "binary"}}}}


# Refusals that do not read the body close the connection: what the client still sends is not
# worth the server's time, and a trickling client must not keep its connection.
CLOSE = {"Connection": "close"}


@contextlib.contextmanager
def one_upload(c: Coordinator, record: WorkerRecord):
    """coop.coordinator.ingest.claim_upload, held while the body is read or drained."""
    try:
        claim_upload(c, record)
    except RequestError as error:
        error.extra["headers"] = CLOSE
        raise
    try:
        yield
    finally:
        c.uploading.discard(record.id)


def check_join_rate(c: Coordinator, request: Request) -> None:
    address = request.client.host if request.client else "?"
    wait = c.join_limiter.retry_after(address, c.clock())
    if wait > 0:
        c.metrics.joins_refused.labels("rate").inc()
        raise RequestError(429, f"too many joins from {address}; at most {c.config.coordinator.joins_per_minute:g} "
                                f"a minute: retry in {wait:.0f} s", headers={"Retry-After": retry_after_header(wait)})


def _bearer(request: Request) -> str | None:
    return bearer_token(request.headers)


async def read_body(request: Request, limit: int, timeout_s: float | None = None,
                    spool: Spool | None = None, budget: MemoryBudget | None = None) -> bytearray | SpooledBody:
    """The request body within `timeout_s` (else 408), refusing more than `limit` bytes (413)
    before reading it when Content-Length says so, and while reading otherwise. In memory
    (preallocated: no repeated copies), or with a `spool` into a file of it as it arrives unless
    its declared size fits the `budget` (reserved there: the caller releases len(body) when done
    with a body in memory). A client that goes away midway raises starlette's ClientDisconnect."""
    if timeout_s is None:
        return await _read_body(request, limit, spool, budget)
    try:
        return await asyncio.wait_for(_read_body(request, limit, spool, budget), timeout_s)
    except asyncio.TimeoutError:
        raise RequestError(408, f"the body did not arrive within {timeout_s:g} s ([coordinator] body_timeout_s); "
                                "send it faster or raise the limit", headers=CLOSE) from None


async def _read_body(request: Request, limit: int, spool: Spool | None = None,
                     budget: MemoryBudget | None = None) -> bytearray | SpooledBody:
    declared = request.headers.get("content-length")
    size = None
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise RequestError(400, f"Content-Length {declared!r:.30} is not a number", headers=CLOSE) from None
        if size < 0:
            raise RequestError(400, f"Content-Length {size} is negative", headers=CLOSE)
        if size > limit:
            raise RequestError(413, f"body of {size} bytes exceeds the limit of {limit} bytes", headers=CLOSE)
    in_ram = spool is None or (size is not None and budget is not None and budget.reserve(size))
    sink = _MemoryBody(size, budget if spool is not None else None) if in_ram else _SpooledSink(spool.body())
    try:
        received = 0
        async for chunk in request.stream():
            received += len(chunk)
            if size is not None and received > size:
                raise RequestError(400, f"body is longer than its Content-Length {size}", headers=CLOSE)
            if received > limit:
                raise RequestError(413, f"body exceeds the limit of {limit} bytes", headers=CLOSE)
            await sink.put(chunk)
        if size is not None and received != size:
            raise RequestError(400, f"body ended after {received} of {size} bytes (truncated upload?)")
        return await sink.done()
    except BaseException:
        sink.discard()
        raise


class _MemoryBody:
    """A body read into memory: into one preallocated buffer when its size was declared."""

    def __init__(self, size: int | None, reserved_from: MemoryBudget | None = None):
        self.declared, self.filled = size is not None, 0
        self.body = uninitialised(size) if self.declared else bytearray()  # (undeclared: grows as it comes)
        self.view = self.body if self.declared else None
        self.reserved_from = reserved_from  # the budget its size was reserved from, given back if it fails

    async def put(self, chunk: bytes) -> None:
        if self.declared:
            self.view[self.filled : self.filled + len(chunk)] = chunk
            self.filled += len(chunk)
        else:
            self.body += chunk

    async def done(self) -> bytearray:
        return self.body

    def discard(self) -> None:
        if self.reserved_from is not None:
            self.reserved_from.release(len(self.body))


class _SpooledSink:
    """A body written to a spool file in SPOOL_WRITE pieces, each in a thread (the event loop never waits on the disk)."""

    def __init__(self, body: SpooledBody):
        self.body, self.pending = body, bytearray()

    async def put(self, chunk: bytes) -> None:
        self.pending += chunk
        if len(self.pending) >= SPOOL_WRITE:
            await self._flush()

    async def done(self) -> SpooledBody:
        if self.pending:
            await self._flush()
        return self.body

    async def _flush(self) -> None:
        pending, self.pending = self.pending, bytearray()
        try:
            await asyncio.to_thread(self.body.write, pending)
        except OSError as error:  # disk full: a 503 the worker retries, not a 500
            raise spool_full(error) from None

    def discard(self) -> None:
        self.body.close()


async def _drain(request: Request, limit: int, timeout_s: float) -> bool:
    """Read and drop a body we refuse, so that the client gets our answer rather than a reset.
    Bounded in size and time; False when it was not drained (then close the connection)."""
    declared = request.headers.get("content-length")
    if declared is None or not declared.isdigit() or int(declared) > limit:
        return False

    async def drop() -> None:
        async for _ in request.stream():
            pass

    try:
        await asyncio.wait_for(drop(), timeout_s)
    except (asyncio.TimeoutError, ClientDisconnect):
        return False
    return True


async def _json_body(request: Request, model: type[BaseModel], limit: int, timeout_s: float,
                     required: bool = False) -> Any:
    try:
        raw = await read_body(request, limit, timeout_s)
    except ClientDisconnect:
        raise RequestError(400, "the client went away before its body was complete") from None
    if not raw and required:
        raise RequestError(422, f"the body must be JSON with the fields of {model.__name__}: "
                                f"{', '.join(model.model_fields)}")
    if not raw:
        return model()
    try:
        return model.model_validate_json(bytes(raw))
    except ValidationError as error:
        raise RequestError(422, f"bad JSON body: {error.errors(include_url=False)}") from None


def create_app(coordinator: Coordinator, upload_port: UploadPort | None = None) -> FastAPI:
    @contextlib.asynccontextmanager  # upload_port: updates also taken on a port of their own (ingest.py)
    async def lifespan(app: FastAPI):
        await coordinator.start()
        listener = upload_port.listen(coordinator) if upload_port is not None else None
        app.state.upload_port = listener.port if listener is not None else None
        yield
        listener.stop() if listener is not None else None
        await coordinator.stop()

    app = FastAPI(title="coop coordinator", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="DiLoCo training over HTTP: workers pull the global weights and push pseudo-gradients.")
    serve_api_docs(app)
    app.state.coordinator = coordinator
    c = coordinator
    json_limit = c.config.coordinator.max_json_bytes
    body_timeout = c.config.coordinator.body_timeout_s

    @app.exception_handler(RequestError)
    async def request_error(request: Request, error: RequestError) -> JSONResponse:
        extra = dict(error.extra)
        headers = extra.pop("headers", None)
        return JSONResponse({"detail": error.message, **extra}, status_code=error.status, headers=headers)

    def authenticate(request: Request):
        """The worker of the request's token, or a 401 that closes the connection (the body unread)."""
        try:
            return c.authenticate(_bearer(request))
        except RequestError as error:
            error.extra["headers"] = CLOSE
            raise

    @app.get("/v1/info")
    async def info() -> dict[str, Any]:
        """What this server is. `coop-worker join URL` asks this first (coordinator or peer)."""
        return {"kind": "coordinator", "version": __version__, "api": "v1", "auth": c.run_token is not None,
                **c.round_info()}

    @app.post("/v1/join", responses=responses(400, 401, 408, 413, 422, 429, 503),
              openapi_extra={"requestBody": {"content": {"application/json": {"schema": JoinRequest.model_json_schema()}}}})
    async def join(request: Request) -> dict[str, Any]:
        """Join the run: returns a worker id and token (keep it), the run config and a data shard index.
        Rate-limited per client address ([coordinator] joins_per_minute: 429 with Retry-After)."""
        check_join_rate(c, request)
        try:
            c.check_run_token(_bearer(request))
        except RequestError as error:
            error.extra["headers"] = CLOSE
            raise
        body = await _json_body(request, JoinRequest, json_limit, body_timeout)
        port = app.state.upload_port  # where updates arrive and weights leave fastest (coop.coordinator.ingest)
        return {**c.join(body.name, body.device),
                **({"upload_port": port, "weights_on_upload_port": True} if port is not None else {})}

    @app.get("/v1/weights", response_class=Response,
             responses={**responses(304, 401), 200: binary("the global weights (safetensors)")})
    async def weights(request: Request) -> Response:
        """The global weights (safetensors; metadata: round, model). ETag is the round. With
        `?since=R` and the compressed downlink on: the change from round R's weights, in the run's
        codec (header X-Coop-Since: R), when R is the last round; else the full weights."""
        status, headers, body = weights_answer(c, _bearer(request), request.headers.get("if-none-match"),
                                               request.query_params.get("since", ""))
        return Response(body, media_type=OCTET, headers=headers) if status == 200 else \
            Response(status_code=status, headers=headers)

    @app.get("/v1/shard", response_class=Response,
             responses={**responses(401), 200: binary("this worker's data shard (safetensors)")})
    async def shard(request: Request) -> Response:
        """This worker's data shard: {"tokens": uint16/uint32 (n,)} with metadata index, count, tokenizer."""
        record = c.authenticate(_bearer(request))
        body = await asyncio.to_thread(c.data.shard_body, record.shard)
        c.count_download(record, len(body), "shard")
        return Response(body, media_type=OCTET, headers={"X-Coop-Shard": str(record.shard)})

    @app.get("/v1/val", response_class=Response,
             responses={**responses(401), 200: binary("the val slice to evaluate on (safetensors)")})
    async def val(request: Request) -> Response:
        """The val tokens every worker evaluates the global weights on: {"tokens": uint16/uint32 (n,)}
        with metadata start, eval_batches, data_id, tokenizer (coop.coordinator.evaluation)."""
        record = c.authenticate(_bearer(request))
        body = await asyncio.to_thread(c.val.body)
        c.count_download(record, len(body), "val")
        return Response(body, media_type=OCTET)

    @app.post("/v1/rounds/{round_number}/eval", response_model=EvalAccepted,
              responses=responses(400, 401, 408, 409, 413, 422),
              openapi_extra={"requestBody": {"content": {"application/json": {"schema": EvalReport.model_json_schema()}},
                                             "required": True}})
    async def evaluation(round_number: int, request: Request) -> dict[str, Any]:
        """Report this worker's val loss of the weights of round r (those GET /v1/weights served for
        round r; r = max_rounds: the final model), over the windows of GET /v1/val: the mean loss and
        the tokens it covered. Every [rounds] eval_every rounds and the final weights; one report a
        worker. The history record of those weights keeps the token-weighted mean of the reports."""
        record = authenticate(request)
        report = await _json_body(request, EvalReport, json_limit, body_timeout, required=True)
        return await c.record_eval(record, round_number, report)

    @app.put("/v1/rounds/{round_number}/update", response_model=UpdateAccepted,
             responses=responses(400, 401, 408, 409, 413, 422),
             openapi_extra={"requestBody": {"content": {OCTET: {"schema": {"type": "string", "format": "binary"}}},
                                            "required": True}})
    async def update(round_number: int, request: Request) -> dict[str, Any]:
        """Upload an encoded pseudo-gradient for round r (safetensors from coop.codec; metadata:
        round, tokens, codec, options, shapes, loss). 409 when round r is not the open round, or
        when this worker already has an upload in flight (one at a time)."""
        limit = c.max_update_bytes
        record = authenticate(request)
        with one_upload(c, record):
            try:
                c.precheck_update(record, round_number)
            except RequestError as error:
                if not await _drain(request, limit, body_timeout):
                    error.extra["headers"] = CLOSE
                raise
            # Every upload is received at once: in RAM while the budget allows, else into a spool
            # file (coop.spool); upload_slots bound only the decodes.
            try:
                body = await read_body(request, limit, body_timeout, c.spool, c.budget)
            except RequestError as error:
                c.reject(record, {413: "too_large", 408: "timeout"}.get(error.status, "invalid"))
                raise
            except ClientDisconnect:
                c.reject(record, "aborted")
                log.warning("upload from %s for round %d aborted by the client", record.id, round_number)
                raise RequestError(400, "the upload was aborted before its body was complete") from None
            return await count_upload(c, record, round_number, body, "api", app.state.upload_port)

    @app.get("/v1/rounds/{round_number}/wait", response_model=RoundInfo, responses=responses(401, 422))
    async def wait(request: Request, round_number: int,
                   timeout_s: float = Query(30.0, ge=0.0, le=300.0)) -> dict[str, Any]:
        """Long-poll: returns when round r has closed (closed: true), the run is done, or after timeout_s.
        `reported` says whether this worker's update for the open round is counted (false after a
        coordinator restart lost it: upload it again)."""
        record = c.authenticate(_bearer(request))
        return await c.wait_round_end(round_number, timeout_s, record)

    @app.post("/v1/heartbeat", response_model=RoundInfo, responses=responses(400, 401, 408, 413))
    async def heartbeat(request: Request) -> dict[str, Any]:
        """The worker is alive (it counts as active for worker_timeout_s)."""
        record = authenticate(request)
        try:  # nothing in the body is needed; bounded all the same
            await read_body(request, json_limit, body_timeout)
        except ClientDisconnect:
            raise RequestError(400, "the client went away before its body was complete") from None
        return c.heartbeat(record)

    @app.post("/v1/leave", responses=responses(401))
    async def leave(request: Request) -> dict[str, Any]:
        """The worker leaves; its token stops working. Rounds stop waiting for it."""
        record = authenticate(request)
        c.leave(record)
        return {"left": True, "worker_id": record.id}

    @app.get("/v1/status", responses=responses(401))
    async def status(request: Request) -> dict[str, Any]:
        """The run: round, phase, workers, totals and the per-round history."""
        c.check_status_access(_bearer(request))
        return c.status()

    model_download = ModelDownload(c.state_dir)

    @app.get("/v1/model", response_class=Response,
             responses={**responses(401), 200: binary("the global model as a model file (safetensors)")})
    async def model(request: Request) -> Response:
        """The global model after the last closed round, as one model file: safetensors tensors with
        the model config and the tokenizer in its metadata (coop.trained). Save it and pass it to
        `coop sample FILE` or `coop export FILE OUT_DIR --format hf`. Needs the run token or a worker token."""
        c.check_status_access(_bearer(request))
        round_number, body = await model_download.body(c.machine.number)
        c.count_download(None, len(body), "model")
        return Response(body, media_type=OCTET, headers={
            "X-Coop-Round": str(round_number),
            "Content-Disposition": f'attachment; filename="model-r{round_number}.safetensors"'})

    @app.get("/metrics", response_class=Response,
             responses={200: {"description": "Prometheus text exposition format",
                              "content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def metrics() -> Response:
        """Prometheus metrics (no auth)."""
        c.metrics.workers_active.set(len(c.active_workers()))
        return Response(c.metrics.render(), media_type=c.metrics.content_type)

    access = PageAccess(c.run_token, also_accepts=lambda token: c.members.authenticate(token) is not None)
    add_login_routes(app, access, "coop coordinator")

    @app.get("/", response_class=HTMLResponse)
    async def page(request: Request) -> HTMLResponse:
        """The status page: HTML with SVG charts. With a run token, the workers' names and devices
        only for the run token or a worker token (Authorization header, or the cookie of /login)."""
        return HTMLResponse(render_page(c.status(), full=access.allows(request), protected=access.protected))

    return app

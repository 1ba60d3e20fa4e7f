"""The coordinator's HTTP API (FastAPI). Versioned under /v1; tensors travel as safetensors bytes
(application/octet-stream), everything else as small JSON. OpenAPI docs at /docs.

    GET  /v1/info                   who is serving: {"kind": "coordinator", "version", ...} (no auth)
    POST /v1/join                   run token -> worker id, worker token, run config, shard
    GET  /v1/weights                global weights (binary), ETag "r<round>", 304 on If-None-Match
    GET  /v1/shard                  this worker's data shard (binary)
    PUT  /v1/rounds/{r}/update      an encoded pseudo-gradient for round r (binary); 409 if r is not open
    GET  /v1/rounds/{r}/wait        long-poll until round r has closed (or timeout_s passed)
    POST /v1/heartbeat              "still here"; returns the round info
    POST /v1/leave                  the worker leaves the run
    GET  /v1/status                 the run as JSON (rounds, workers, history)
    GET  /metrics                   Prometheus metrics (no auth)
    GET  /                          status page: HTML with SVG charts (no auth)

Errors are JSON {"detail": "..."} with 400 (malformed), 401 (token), 409 (stale round),
413 (too large), 422 (not an update of this model), 503 (full).
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coop import __version__

from .page import render_page
from .service import Coordinator
from .updates import RequestError

OCTET = "application/octet-stream"


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


class UpdateAccepted(BaseModel):
    accepted: bool
    round: int
    norm: float
    reports: int


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


async def read_body(request: Request, limit: int) -> bytearray:
    """The request body, refusing more than `limit` bytes (413) before reading it when
    Content-Length says so, and while reading otherwise. Preallocated: no repeated copies."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise RequestError(400, f"Content-Length {declared!r:.30} is not a number") from None
        if size > limit:
            raise RequestError(413, f"body of {size} bytes exceeds the limit of {limit} bytes")
        body = bytearray(size)
        view, filled = memoryview(body), 0
        async for chunk in request.stream():
            end = filled + len(chunk)
            if end > size:
                raise RequestError(400, f"body is longer than its Content-Length {size}")
            view[filled:end] = chunk
            filled = end
        if filled != size:
            raise RequestError(400, f"body ended after {filled} of {size} bytes (truncated upload?)")
        return body
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(413, f"body exceeds the limit of {limit} bytes")
    return body


async def _drain(request: Request, limit: int) -> None:
    """Read and drop a body we refuse, so that the client gets our answer rather than a reset."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) <= limit:
        with contextlib.suppress(Exception):
            async for _ in request.stream():
                pass


async def _json_body(request: Request, model: type[BaseModel], limit: int) -> Any:
    raw = await read_body(request, limit)
    if not raw:
        return model()
    try:
        return model.model_validate_json(bytes(raw))
    except ValidationError as error:
        raise RequestError(422, f"bad JSON body: {error.errors(include_url=False)}") from None


def create_app(coordinator: Coordinator) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await coordinator.start()
        yield
        await coordinator.stop()

    app = FastAPI(title="coop coordinator", version=__version__, lifespan=lifespan,
                  description="DiLoCo training over HTTP: workers pull the global weights and push pseudo-gradients.")
    app.state.coordinator = coordinator
    c = coordinator
    json_limit = c.config.coordinator.max_json_bytes

    @app.exception_handler(RequestError)
    async def request_error(request: Request, error: RequestError) -> JSONResponse:
        return JSONResponse({"detail": error.message, **error.extra}, status_code=error.status)

    @app.get("/v1/info")
    async def info() -> dict[str, Any]:
        """What this server is. `coop-worker join URL` asks this first (coordinator or peer)."""
        return {"kind": "coordinator", "version": __version__, "api": "v1", "auth": c.run_token is not None,
                **c.round_info()}

    @app.post("/v1/join", openapi_extra={"requestBody": {"content": {"application/json": {
        "schema": JoinRequest.model_json_schema()}}}})
    async def join(request: Request) -> dict[str, Any]:
        """Join the run: returns a worker id and token (keep it), the run config and a data shard index."""
        c.check_run_token(_bearer(request))
        body = await _json_body(request, JoinRequest, json_limit)
        return c.join(body.name, body.device)

    @app.get("/v1/weights", responses={200: {"content": {OCTET: {}}}, 304: {}})
    async def weights(request: Request) -> Response:
        """The global weights (safetensors; metadata: round, model). ETag is the round."""
        token = _bearer(request)
        record = c.members.authenticate(token) if token else None
        if record is None:
            c.check_status_access(token)
        else:
            record.last_seen = c.clock()
        body, round_number = c.weights_body, c.machine.number
        etag = f'"r{round_number}"'
        headers = {"ETag": etag, "X-Coop-Round": str(round_number), "Cache-Control": "no-cache"}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        c.count_download(record, len(body), "weights")
        return Response(body, media_type=OCTET, headers=headers)

    @app.get("/v1/shard", responses={200: {"content": {OCTET: {}}}})
    async def shard(request: Request) -> Response:
        """This worker's data shard: {"tokens": uint16/uint32 (n,)} with metadata index, count, tokenizer."""
        record = c.authenticate(_bearer(request))
        body = await asyncio.to_thread(c.data.shard_body, record.shard)
        c.count_download(record, len(body), "shard")
        return Response(body, media_type=OCTET, headers={"X-Coop-Shard": str(record.shard)})

    @app.put("/v1/rounds/{round_number}/update", response_model=UpdateAccepted,
             openapi_extra={"requestBody": {"content": {OCTET: {"schema": {"type": "string", "format": "binary"}}},
                                            "required": True}})
    async def update(round_number: int, request: Request) -> dict[str, Any]:
        """Upload an encoded pseudo-gradient for round r (safetensors from coop.codec; metadata:
        round, tokens, codec, options, shapes, loss). 409 when round r is not the open round."""
        limit = c.max_update_bytes
        try:
            record = c.authenticate(_bearer(request))
            c.precheck_update(record, round_number)
        except RequestError:
            await _drain(request, limit)
            raise
        async with c.upload_slots:  # bounds the bodies held in memory at once
            try:
                body = await read_body(request, limit)
            except RequestError as error:
                c.reject(record, "too_large" if error.status == 413 else "invalid")
                raise
            return await c.submit_update(record, round_number, body)

    @app.get("/v1/rounds/{round_number}/wait", response_model=RoundInfo)
    async def wait(request: Request, round_number: int,
                   timeout_s: float = Query(30.0, ge=0.0, le=300.0)) -> dict[str, Any]:
        """Long-poll: returns when round r has closed (closed: true), the run is done, or after timeout_s.
        `reported` says whether this worker's update for the open round is counted (false after a
        coordinator restart lost it: upload it again)."""
        record = c.authenticate(_bearer(request))
        return await c.wait_round_end(round_number, timeout_s, record)

    @app.post("/v1/heartbeat", response_model=RoundInfo)
    async def heartbeat(request: Request) -> dict[str, Any]:
        """The worker is alive (it counts as active for worker_timeout_s)."""
        record = c.authenticate(_bearer(request))
        await read_body(request, json_limit)  # nothing in it is needed; bounded all the same
        return c.heartbeat(record)

    @app.post("/v1/leave")
    async def leave(request: Request) -> dict[str, Any]:
        """The worker leaves; its token stops working. Rounds stop waiting for it."""
        record = c.authenticate(_bearer(request))
        c.leave(record)
        return {"left": True, "worker_id": record.id}

    @app.get("/v1/status")
    async def status(request: Request) -> dict[str, Any]:
        """The run: round, phase, workers, totals and the per-round history."""
        c.check_status_access(_bearer(request))
        return c.status()

    @app.get("/metrics")
    async def metrics() -> Response:
        c.metrics.workers_active.set(len(c.active_workers()))
        return Response(c.metrics.render(), media_type=c.metrics.content_type)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(render_page(c.status()))

    return app

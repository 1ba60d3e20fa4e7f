"""The HTTP API a peer serves to the other peers (FastAPI under uvicorn, in a background thread).

Routes only: every decision is the node's (`coop.gossip.node.PeerState`); a node method raises
`PeerError(status, detail)` and the route answers that status with {"detail": ..., "round": ...}.
With a swarm token, everything but /v1/info, /v1/status, /metrics, /docs and the status page `/`
needs `Authorization: Bearer <token>`; the page then shows the members and the partners only with
the token (the header, or the cookie of /login: `coop.pageaccess`).
"""
from __future__ import annotations

import asyncio
import hmac
import threading
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.requests import ClientDisconnect

from coop import __version__
from coop.apidocs import serve_api_docs
from coop.gossip.metrics import PeerMetrics
from coop.gossip.node import PeerError, PeerState
from coop.gossip.protocol import (
    MAX_JSON_BYTES,
    Heartbeat,
    JoinReply,
    JoinRequest,
    LeaveRequest,
    PeerInfo,
    Status,
    UpdateAccepted,
)
from coop.gossip.page import render_peer_page
from coop.pageaccess import PageAccess, add_login_routes
from coop.serving import server_config

BINARY = "application/octet-stream"
BODY_TIMEOUT_S = 300.0  # to send one body (peers' own requests give up after request_timeout_s)

_MEANING = {
    400: "malformed body or Content-Length",
    401: "missing or wrong swarm token",
    403: "another swarm's message, or a sender that is not a member",
    408: "the body did not arrive in time ([gossip] body_timeout_s for updates)",
    409: "the round is closed or too far ahead here, or this update came already",
    410: "this peer has finished or stopped: talk to another peer",
    413: "the body is over this endpoint's limit",
    422: "well-formed but not acceptable (bad fields, another model)",
    503: "this peer is still starting, or its inbox is full: retry later",
}


def responses(*codes: int, ok: dict[str, Any] | None = None) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route besides its 200 (errors are JSON {"detail", "round"?})."""
    out: dict[int | str, dict[str, Any]] = {200: ok} if ok else {}
    schema = {"type": "object", "properties": {"detail": {}, "round": {"type": "integer"}}, "required": ["detail"]}
    for code in codes:
        out[code] = {"description": _MEANING[code], "content": {"application/json": {"schema": schema}}}
    return out


def check_declared_length(request: Request, limit: int) -> None:
    """413 before reading anything when the Content-Length header already says the body is too big."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise PeerError(400, f"Content-Length must be a non-negative integer, got {declared!r:.40}")
        if int(declared) > limit:
            raise PeerError(413, f"body of {declared} bytes is over this endpoint's limit of {limit} bytes")


async def read_body(request: Request, limit: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed `limit` bytes, and
    with 408 when it has not all come within `timeout_s` (a trickling client holds nothing long)."""
    check_declared_length(request, limit)
    chunks, size = [], 0

    async def read() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PeerError(413, f"body is over this endpoint's limit of {limit} bytes")
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise PeerError(408, f"the body did not arrive within {timeout_s:g} s") from None
    return b"".join(chunks)


async def read_json(request: Request, model: type) -> Any:
    body = await read_body(request, MAX_JSON_BYTES)
    try:
        return model.model_validate_json(body)
    except ValueError as error:  # pydantic.ValidationError is a ValueError
        raise PeerError(422, f"bad {model.__name__} body: {error}") from error


def create_app(node: PeerState) -> FastAPI:
    app = FastAPI(title="coop peer", version=__version__, docs_url=None, redoc_url=None,
                  description="Peer-to-peer DiLoCo: the API peers serve each other (docs/p2p.md).")
    serve_api_docs(app)

    @app.exception_handler(PeerError)
    async def _peer_error(request: Request, error: PeerError) -> JSONResponse:
        content: dict[str, Any] = {"detail": error.detail}
        if error.round is not None:
            content["round"] = error.round
        return JSONResponse(status_code=error.status, content=content)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(error)})

    def require_token(request: Request) -> None:
        if node.token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), node.token.encode()):
            node.count_refused(401, f"missing or wrong swarm token on {request.url.path}")
            raise PeerError(401, "missing or wrong swarm token: send 'Authorization: Bearer <token>' "
                                 "with the token the swarm was started with")

    auth = [Depends(require_token)]

    json_errors = responses(400, 401, 403, 408, 410, 413, 422, 503)

    @app.get("/v1/info", response_model=PeerInfo)
    def info() -> PeerInfo:
        return node.info()

    @app.get("/v1/status", response_model=Status, responses=responses(503))
    def status() -> Status:
        return node.status()

    metrics = PeerMetrics(node)
    access = PageAccess(node.token)
    add_login_routes(app, access, "coop peer")

    @app.get("/metrics", response_class=Response,
             responses={200: {"description": "Prometheus text exposition format",
                              "content": {"text/plain": {"schema": {"type": "string"}}}}})
    def prometheus_metrics() -> Response:
        """Prometheus metrics (no token needed): the peer's figures, its process, its build."""
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/", response_class=HTMLResponse)
    def page(request: Request) -> HTMLResponse:
        """The status page: HTML with SVG charts. With a swarm token, the members and partners only
        for the token (Authorization header, or the cookie of /login)."""
        return HTMLResponse(render_peer_page(node.status(), full=access.allows(request), protected=access.protected))

    @app.post("/v1/join", response_model=JoinReply, dependencies=auth, responses=json_errors)
    async def join(request: Request) -> JoinReply:
        return node.handle_join(await read_json(request, JoinRequest))

    @app.post("/v1/heartbeat", response_model=Heartbeat, dependencies=auth, responses=json_errors)
    async def heartbeat(request: Request) -> Heartbeat:
        return node.handle_heartbeat(await read_json(request, Heartbeat))

    @app.post("/v1/leave", dependencies=auth, responses=json_errors)
    async def leave(request: Request) -> dict:
        node.handle_leave(await read_json(request, LeaveRequest))
        return {"left": True}

    @app.get("/v1/state", dependencies=auth, response_class=Response,
             responses={200: {"content": {BINARY: {}}, "description": "global weights + outer optimizer state"},
                        **responses(401, 410, 503)})
    async def state() -> Response:
        body = await run_in_threadpool(node.state_body)
        return Response(body, media_type=BINARY)

    @app.get("/v1/data", dependencies=auth, response_class=Response,
             responses={200: {"content": {BINARY: {}}, "description": "the training tokens and the tokenizer"},
                        **responses(401, 410, 503)})
    async def data() -> Response:
        return Response(await run_in_threadpool(node.data_body), media_type=BINARY)

    @app.post("/v1/gossip/{round_index}", response_model=UpdateAccepted, dependencies=auth,
              responses=responses(400, 401, 403, 408, 409, 410, 413, 422, 503),
              openapi_extra={"requestBody": {"content": {BINARY: {}}, "required": True}})
    async def gossip(round_index: int, request: Request) -> UpdateAccepted:
        if round_index < 0:
            raise PeerError(422, f"round must be >= 0, got {round_index}")
        try:
            check_declared_length(request, node.update_limit())
        except PeerError as error:
            node.count_refused(error.status, error.detail)
            raise
        node.precheck_update(round_index)  # a stale round is turned away before its body is read
        try:
            body = await read_body(request, node.update_limit(), node.config.gossip.body_timeout_s)
        except PeerError as error:
            node.count_refused(error.status, error.detail)
            raise
        except ClientDisconnect:  # the sender went away mid-body: nobody to answer, one line, no traceback
            node.count_refused(400, f"an update for round {round_index} was aborted by its sender mid-body")
            return Response(status_code=400)
        return await run_in_threadpool(node.receive_update, round_index, body)

    return app


class ServerThread:
    """uvicorn serving `app` from a daemon thread (the main thread trains)."""

    def __init__(self, app: FastAPI, host: str, port: int):
        # limits on connections, keep-alive and the request head (coop.serving); bodies: read_body
        config = server_config(app, host, port, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="peer-http", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        self.thread.start()
        waited = 0.0
        while not self.server.started:
            if not self.thread.is_alive():
                raise SystemExit("the peer's HTTP server did not start (port in use? see the error above)")
            self.thread.join(0.05)
            waited += 0.05
            if waited > timeout:
                raise SystemExit(f"the peer's HTTP server did not start within {timeout}s")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(5)

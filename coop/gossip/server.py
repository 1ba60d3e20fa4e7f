"""The HTTP API a peer serves to the other peers (FastAPI under uvicorn, in a background thread).

Routes only: every decision is the node's (`coop.gossip.node.PeerState`); a node method raises
`PeerError(status, detail)` and the route answers that status with {"detail": ..., "round": ...}.
With a swarm token, everything but /v1/info and /v1/status needs `Authorization: Bearer <token>`.
"""
from __future__ import annotations

import hmac
import threading
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from coop import __version__
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

BINARY = "application/octet-stream"


def check_declared_length(request: Request, limit: int) -> None:
    """413 before reading anything when the Content-Length header already says the body is too big."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise PeerError(400, f"Content-Length must be a non-negative integer, got {declared!r:.40}")
        if int(declared) > limit:
            raise PeerError(413, f"body of {declared} bytes is over this endpoint's limit of {limit} bytes")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed `limit` bytes."""
    check_declared_length(request, limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PeerError(413, f"body is over this endpoint's limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, model: type) -> Any:
    body = await read_body(request, MAX_JSON_BYTES)
    try:
        return model.model_validate_json(body)
    except ValueError as error:  # pydantic.ValidationError is a ValueError
        raise PeerError(422, f"bad {model.__name__} body: {error}") from error


def create_app(node: PeerState) -> FastAPI:
    app = FastAPI(title="coop peer", version=__version__,
                  description="Peer-to-peer DiLoCo: the API peers serve each other (docs/p2p.md).")

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
            node.count_refused()
            raise PeerError(401, "missing or wrong swarm token: send 'Authorization: Bearer <token>' "
                                 "with the token the swarm was started with")

    auth = [Depends(require_token)]

    @app.get("/v1/info", response_model=PeerInfo)
    def info() -> PeerInfo:
        return node.info()

    @app.get("/v1/status", response_model=Status)
    def status() -> Status:
        return node.status()

    @app.post("/v1/join", response_model=JoinReply, dependencies=auth)
    async def join(request: Request) -> JoinReply:
        return node.handle_join(await read_json(request, JoinRequest))

    @app.post("/v1/heartbeat", response_model=Heartbeat, dependencies=auth)
    async def heartbeat(request: Request) -> Heartbeat:
        return node.handle_heartbeat(await read_json(request, Heartbeat))

    @app.post("/v1/leave", dependencies=auth)
    async def leave(request: Request) -> dict:
        node.handle_leave(await read_json(request, LeaveRequest))
        return {"left": True}

    @app.get("/v1/state", dependencies=auth, response_class=Response,
             responses={200: {"content": {BINARY: {}}, "description": "global weights + outer optimizer state"}})
    async def state() -> Response:
        body = await run_in_threadpool(node.state_body)
        return Response(body, media_type=BINARY)

    @app.get("/v1/data", dependencies=auth, response_class=Response,
             responses={200: {"content": {BINARY: {}}, "description": "the training tokens and the tokenizer"}})
    async def data() -> Response:
        return Response(await run_in_threadpool(node.data_body), media_type=BINARY)

    @app.post("/v1/gossip/{round_index}", response_model=UpdateAccepted, dependencies=auth,
              openapi_extra={"requestBody": {"content": {BINARY: {}}, "required": True}})
    async def gossip(round_index: int, request: Request) -> UpdateAccepted:
        if round_index < 0:
            raise PeerError(422, f"round must be >= 0, got {round_index}")
        try:
            check_declared_length(request, node.update_limit())
        except PeerError:
            node.count_refused()
            raise
        node.precheck_update(round_index)  # a stale round is refused before its body is read
        try:
            body = await read_body(request, node.update_limit())
        except PeerError:
            node.count_refused()
            raise
        return await run_in_threadpool(node.receive_update, round_index, body)

    return app


class ServerThread:
    """uvicorn serving `app` from a daemon thread (the main thread trains)."""

    def __init__(self, app: FastAPI, host: str, port: int):
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=2)
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

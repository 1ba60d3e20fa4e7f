"""The worker's side of the coordinator's HTTP API: httpx with the worker's token, retries with
backoff, errors turned into exceptions that say what to do, and the heartbeat thread."""
from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import httpx

from ..progress import format_duration
from ..throttle import Link

log = logging.getLogger("coop.worker")


class WorkerError(Exception):
    """The worker cannot go on (the message says why and what to do); `status`: the HTTP status
    that said so, None when the coordinator could not be reached."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class NeedsRejoin(Exception):
    """The coordinator does not know our token (it lost its state, or we were removed): join again."""


class CoordinatorClient:
    """httpx with the worker's token, retries with backoff, and errors turned into exceptions."""

    RETRY_STATUS = {429, 502, 503, 504}  # 429/503 with Retry-After: joins rate-limited, run full

    def __init__(self, url: str, retry_for_s: float, timeout_s: float, link: Link | None = None):
        self.url = url.rstrip("/")
        self.retry_for_s = retry_for_s
        timeout = httpx.Timeout(timeout_s, connect=10.0)
        # link: --limit-rate / --latency, this worker's transfers paced as over that link (coop.throttle)
        self.http = httpx.Client(base_url=self.url, timeout=timeout, follow_redirects=True,
                                 transport=link.transport() if link else None)
        self.token: str | None = None
        # where updates go: the coordinator's upload port when it has one and it answers, else None
        # (the API's route); set at every join (coop.coordinator.ingest)
        self.upload_url: str | None = None
        self.weights_via_upload_port = False  # the port serves GET /v1/weights too (the join says so)
        self.upload_port_failures = 0  # in a row; at UPLOAD_PORT_TRIES the port is given up
        self.bytes_up = 0
        self.bytes_down = 0

    def close(self) -> None:
        self.http.close()

    def use_upload_port(self, port: int | None, weights: bool = False) -> None:
        """The join's `upload_port`: the same host and scheme as the API, that port; `weights`: it
        serves the weights too (a coordinator of before that answers 404 there)."""
        self.upload_url = str(httpx.URL(self.url).copy_with(port=port, path="/")).rstrip("/") if port else None
        self.weights_via_upload_port = bool(port and weights)
        self.upload_port_failures = 0

    def request(self, method: str, path: str, *, token: str | None = None, retry: bool = True,
                ok: tuple[int, ...] = (200,), **kwargs: Any) -> httpx.Response:
        """Send, retrying network errors and 502/503/504 with exponential backoff (with jitter)
        for up to retry_for_s. 401 raises NeedsRejoin; other unexpected statuses WorkerError."""
        headers = dict(kwargs.pop("headers", {}) or {})
        bearer = token or self.token
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        body_factory = kwargs.pop("body_factory", None)
        start, attempt = time.monotonic(), 0
        while True:
            retry_after = None
            try:
                if body_factory is not None:
                    kwargs["content"] = body_factory()  # an iterator can be consumed only once
                response = self.http.request(method, path, headers=headers, **kwargs)
            except httpx.TransportError as error:
                problem = f"{type(error).__name__}: {error}"
                if self.token and bearer == self.token and ("content" in kwargs or "json" in kwargs):
                    self._check_token(bearer)
            else:
                if response.status_code in ok:
                    return response
                if response.status_code == 401:
                    raise NeedsRejoin(_detail(response))
                if response.status_code not in self.RETRY_STATUS:
                    raise WorkerError(f"{method} {path} -> {response.status_code}: {_detail(response)}",
                                      response.status_code)
                problem = f"HTTP {response.status_code}: {_detail(response)}"
                retry_after = _retry_after(response)
            elapsed = time.monotonic() - start
            if not retry or elapsed > self.retry_for_s:
                raise WorkerError(f"cannot reach the coordinator at {self.url} ({problem}); gave up after "
                                  f"{format_duration(elapsed)}")
            delay = min(5.0, 0.25 * 2 ** min(attempt, 5)) * random.uniform(0.5, 1.0)
            if retry_after is not None:  # the server said when; never sooner, and at most a minute
                delay = min(60.0, max(delay, retry_after))
            if attempt == 0 or attempt % 5 == 4:
                log.warning("%s %s failed (%s); retrying", method, path, problem)
            attempt += 1
            time.sleep(delay)

    def _check_token(self, bearer: str) -> None:
        """After a request with a body failed in transit: is it our token? The coordinator answers
        a 401 before reading the body and closes the connection, which a large upload may see as
        a reset rather than the 401; a heartbeat (no body) tells which, and NeedsRejoin follows."""
        try:
            response = self.http.post("/v1/heartbeat", headers={"Authorization": f"Bearer {bearer}"}, json={},
                                      timeout=10.0)
        except httpx.HTTPError:
            return
        if response.status_code == 401:
            raise NeedsRejoin(_detail(response))


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))[:500]
    except (ValueError, AttributeError):
        return response.text[:500]


class Heartbeat(threading.Thread):
    """Tells the coordinator every `period` seconds that this worker is alive (while it trains)."""

    def __init__(self, client: CoordinatorClient, period: float):
        super().__init__(name="coop-heartbeat", daemon=True)
        self.client, self.period = client, period
        self.stopped = threading.Event()
        self.http = httpx.Client(base_url=client.url, timeout=httpx.Timeout(10.0))

    def run(self) -> None:
        while not self.stopped.wait(self.period):
            token = self.client.token
            if not token:
                continue
            try:
                self.http.post("/v1/heartbeat", headers={"Authorization": f"Bearer {token}"}, json={})
            except httpx.HTTPError:
                pass  # the main loop sees and retries real outages

    def stop(self) -> None:
        self.stopped.set()
        self.http.close()

"""Who sees the whole status page of a server that has an access token (coordinator or peer).

Without a token everybody sees everything. With one, `/` shows anyone the run's figures (round,
losses, counts, bytes, the charts) and only those who present the token also see names and
addresses (workers, peers). A browser cannot send an Authorization header by itself, so:

    GET  /login     a form with one field, the token
    POST /login     token=... (form-encoded): right -> 303 to / with the cookie `coop_page`;
                    wrong -> 401 and the form again
    POST /logout    clears the cookie, 303 to /

The cookie holds HMAC-SHA256(token, "coop status page"), never the token itself: it is good for
this page only, and a new token makes every old cookie worthless. It is HttpOnly, SameSite=Lax,
Secure when the page came over https, and lasts 30 days. Scripts may instead send
`Authorization: Bearer <token>` with GET / (the coordinator also takes a worker's token there, as
it does for /v1/status). The token is never put in a URL (it would stay in histories and logs).
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Callable
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.requests import ClientDisconnect

from coop.statuspage import login_page

COOKIE = "coop_page"
COOKIE_MAX_AGE_S = 30 * 24 * 3600
MAX_FORM_BYTES = 4096  # token=<a few dozen characters>
FORM_TIMEOUT_S = 10.0

_HTML = {"text/html": {"schema": {"type": "string"}}}
LOGIN_RESPONSES: dict[int | str, dict] = {
    303: {"description": "logged in: the cookie is set, go to /"},
    400: {"description": "not a form-encoded body with a `token` field, or one over 4 KB", "content": _HTML},
    401: {"description": "wrong token: the form again", "content": _HTML},
}


def bearer_of(request: Request) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


class PageAccess:
    """The page's access rule for one server. `token` None: no token, the page is open.
    `also_accepts`: other bearer tokens that see the whole page (a coordinator's worker tokens)."""

    def __init__(self, token: str | None, also_accepts: Callable[[str], bool] | None = None):
        self.token = token or None
        self.also_accepts = also_accepts

    @property
    def protected(self) -> bool:
        return self.token is not None

    def cookie_value(self) -> str:
        return hmac.new(self.token.encode(), b"coop status page", hashlib.sha256).hexdigest()

    def token_is_right(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def allows(self, request: Request) -> bool:
        """Whether this request sees the whole page."""
        if self.token is None:
            return True
        given = bearer_of(request)
        if given is not None and (self.token_is_right(given) or (self.also_accepts and self.also_accepts(given))):
            return True
        cookie = request.cookies.get(COOKIE)
        return cookie is not None and hmac.compare_digest(cookie.encode(), self.cookie_value().encode())


async def _form_token(request: Request) -> str | None:
    """The `token` field of a small form-encoded body; None when the body is not that."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_FORM_BYTES):
        return None
    body = bytearray()

    async def read() -> bool:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > MAX_FORM_BYTES:
                return False
        return True

    try:
        if not await asyncio.wait_for(read(), FORM_TIMEOUT_S):
            return None
    except (asyncio.TimeoutError, ClientDisconnect):  # too slow, or gone mid-body: no form
        return None
    try:
        fields = parse_qs(body.decode("utf-8"), max_num_fields=4, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        return None
    values = fields.get("token", [])
    return values[0] if len(values) == 1 and values[0] else None


def add_login_routes(app: FastAPI, access: PageAccess, heading: str) -> None:
    """GET /login, POST /login and POST /logout on `app` (see the module's docstring)."""

    @app.get("/login", response_class=HTMLResponse, responses={200: {"content": _HTML, "description": "the form"}})
    async def login_form() -> HTMLResponse:
        """The log-in form of the status page (a server without a token needs none: see /)."""
        return HTMLResponse(login_page(heading))

    @app.post("/login", response_class=Response, responses=LOGIN_RESPONSES, status_code=303)
    async def login(request: Request) -> Response:
        """Check the token of the form (`token=...`, form-encoded) and set the page's cookie."""
        if access.token is None:  # nothing to log into: everyone sees the whole page
            return RedirectResponse("/", status_code=303)
        given = await _form_token(request)
        if given is None:
            return HTMLResponse(login_page(heading, "send the form: one field, token"), status_code=400,
                                headers={"Connection": "close"})
        if not access.token_is_right(given):
            return HTMLResponse(login_page(heading, "wrong token"), status_code=401)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, access.cookie_value(), max_age=COOKIE_MAX_AGE_S, path="/", httponly=True,
                            samesite="lax", secure=request.url.scheme == "https")
        return response

    @app.post("/logout", response_class=Response, status_code=303,
              responses={303: {"description": "the cookie is cleared, go to /"}})
    async def logout() -> Response:
        """Forget this browser's log-in."""
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="lax")
        return response

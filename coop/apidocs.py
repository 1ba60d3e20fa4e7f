"""The API documentation of a coop server (coordinator or peer), complete without internet.

FastAPI's own /docs and /redoc load Swagger UI and ReDoc from a CDN: on a machine without internet,
or one that may not reach that CDN, they are blank pages. Here the pages load the copies that the
`fastapi-offline` package ships (Swagger UI 5, which reads OpenAPI 3.1 as FastAPI writes it, and
ReDoc), served under /static/docs/. The schema also declares the bearer token
(`components.securitySchemes.bearer`), on every operation that can answer 401, so that Swagger UI's
"Authorize" button sends `Authorization: Bearer <token>`.

    app = FastAPI(..., docs_url=None, redoc_url=None)
    serve_api_docs(app)
"""
from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/static/docs"
BEARER = {"type": "http", "scheme": "bearer",
          "description": "the run's (or swarm's) access token; a coordinator's workers use the token they got at join"}


def assets_dir() -> str:
    """Where the Swagger UI and ReDoc files are on this machine (the `fastapi-offline` package)."""
    return str(files("fastapi_offline") / "static")


def declare_bearer(app: FastAPI) -> None:
    """The app's schema with the bearer scheme, required by every operation that documents a 401
    (the status page takes it optionally)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()  # FastAPI's: it caches it in app.openapi_schema, which is amended in place
        schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = BEARER
        for path, item in schema.get("paths", {}).items():
            for operation in item.values():
                if "401" in operation.get("responses", {}):
                    operation["security"] = [{"bearer": []}]
                elif path == "/":
                    operation["security"] = [{}, {"bearer": []}]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def serve_api_docs(app: FastAPI) -> None:
    """/docs (Swagger UI), /redoc and their assets under /static/docs/, none from outside; and the
    bearer scheme in /openapi.json. The app must be made with docs_url=None, redoc_url=None."""
    if app.docs_url or app.redoc_url:
        raise ValueError("serve_api_docs replaces FastAPI's /docs and /redoc: make the app with "
                         "docs_url=None, redoc_url=None")
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")
    declare_bearer(app)

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} · API",
                                   swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png")

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} · API",
                              redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png", with_google_fonts=False)

"""The frame of a status page, shared by the coordinator (`coop.coordinator.page`) and the peers
(`coop.gossip.page`): server-rendered HTML that refreshes itself, cards of figures, tables, the
charts of `coop.charts`, and the login form of `coop.pageaccess`. No JavaScript, no build step."""
from __future__ import annotations

import html
import time
from typing import Any

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#111;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
.muted{color:#6b7280;fill:#6b7280} .cards{display:flex;gap:12px;flex-wrap:wrap}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:10px 14px;min-width:110px}
.card b{display:block;font-size:18px} .charts{display:flex;gap:16px;flex-wrap:wrap}
svg{background:#fff;border:1px solid #e5e7eb;border-radius:8px} .title{font-weight:600;font-size:13px}
.axis{font-size:10px;fill:#6b7280} .legend{font-size:11px} .frame{fill:none;stroke:#d1d5db}
.grid{stroke:#f3f4f6} table{border-collapse:collapse;background:#fff}
td,th{border:1px solid #e5e7eb;padding:4px 8px;text-align:right} th{background:#f3f4f6}
td:first-child,th:first-child{text-align:left} .on{color:#16a34a} .off{color:#9ca3af}
form.login{display:flex;gap:8px;align-items:center;margin:8px 0} .error{color:#dc2626}
"""


def fmt(value: Any, digits: int = 4) -> str:
    """A figure for a card or a cell, HTML-escaped: floats to `digits` decimals, ints with
    thousands separators, None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else html.escape(str(value))


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def cards(items: list[tuple[str, Any]]) -> str:
    """A row of cards (label, value); a value of None shows a dash."""
    body = "".join(f"<div class='card'><span class='muted'>{html.escape(k)}</span><b>{fmt(v)}</b></div>"
                   for k, v in items)
    return f"<div class='cards'>{body}</div>"


def table(header: list[str], rows: list[list[str]]) -> str:
    """An HTML table; the cells are HTML already (escape what came from outside before)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def login_form(error: str = "") -> str:
    """The form that POSTs the token to /login (coop.pageaccess), which sets the page's cookie."""
    message = f"<span class='error'>{html.escape(error)}</span>" if error else ""
    return ("<form class='login' method='post' action='/login'><label>token "
            "<input type='password' name='token' autocomplete='current-password' required></label>"
            f"<button type='submit'>show everything</button>{message}</form>")


def logout_form() -> str:
    return ("<form class='login' method='post' action='/logout'><button type='submit'>log out</button>"
            "<span class='muted'>(this browser sees the whole page)</span></form>")


def access_note(protected: bool, authorised: bool) -> str:
    """What the reader of a page of a server with a token sees about access: a link to the login
    page (a form on this page would be wiped by its refresh), or a log-out button."""
    if not protected:
        return ""
    if authorised:
        return logout_form()
    return ("<p class='muted'>This server has an access token: without it this page shows the run's figures "
            "only, no names or addresses. <a href='/login'>Log in</a> to see everything.</p>")


def login_page(heading: str, error: str = "") -> str:
    """GET /login (and a refused POST /login): the form alone, not refreshed."""
    return page(f"{heading} · log in", heading, "log in with the access token", [login_form(error)],
                [("status page", "/")], refresh_s=None)


def page(title: str, heading: str, subtitle: str, body: list[str], links: list[tuple[str, str]],
         refresh_s: int | None = 5) -> str:
    """A whole page. `subtitle` and `body` are HTML already; `links` are (label, path)."""
    refresh = f"<meta http-equiv='refresh' content='{refresh_s}'>" if refresh_s else ""
    footer = " · ".join(f"{html.escape(label)}: <a href='{html.escape(path)}'>{html.escape(path)}</a>"
                        for label, path in links)
    return "".join([
        f"<!doctype html><html><head><meta charset='utf-8'>{refresh}<title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(heading)}</h1>",
        f"<div class='muted'>{subtitle} · {time.strftime('%Y-%m-%d %H:%M:%S')}</div>",
        *body,
        f"<p class='muted'>{footer}</p></body></html>",
    ])

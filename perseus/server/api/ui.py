"""``/ui``: the planner's web page, served from files installed with the package.

The page (``static/index.html``, ``ui.js``, ``ui.css``) draws its charts as plain SVG from a
few lines of JavaScript instead of a chart library: two scatter charts and the running
plan's timeline (a row of boxes per GPU, from ``GET .../timeline``) need no dependency to
vendor, audit and update, the page stays near 25 kB, and every value reaches the DOM as text.
It reads the ``/v1`` API with the token the user types (admin: ``/v1/overview``; a job's
token: that job), sent only in the Authorization header. Nothing comes from a CDN.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["UI_PATH", "add_ui_routes"]

UI_PATH = "/ui"

# The page's own scripts only; no inline script, no other origin.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def add_ui_routes(app: FastAPI) -> None:
    """Serve the page at ``/ui`` and its files under ``/ui/static``."""
    static = resources.files("perseus.server.api") / "static"
    index = (static / "index.html").read_text(encoding="utf-8")
    app.mount(f"{UI_PATH}/static", StaticFiles(directory=str(static)), name="ui-static")

    @app.get(UI_PATH, include_in_schema=False)
    async def ui() -> HTMLResponse:
        return HTMLResponse(
            index,
            headers={
                "Content-Security-Policy": _CSP,
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-cache",
            },
        )

"""The planner server: FastAPI app factory, routes, job store, background planning.

Import :func:`perseus.server.app.create_app` for the app; this package module itself stays
light so that planning worker processes import only what they run.
"""

from __future__ import annotations

__all__: list[str] = []

"""The web dashboard: every job queue's counts, pending and scheduled jobs, dead letters with
retry, groups, batches and flows, over the operator API (``respire_actors.admin``).

Needs the ``dashboard`` extra (``pip install 'respire-actors[dashboard]'``: Starlette, Jinja2,
Hypercorn). See docs/dashboard.md for mounting it and for its security settings.
"""

from .app import Dashboard
from .config import BasicAuth, DashboardConfig, TokenAuth
from .server import serve_dashboard

__all__ = ["BasicAuth", "Dashboard", "DashboardConfig", "TokenAuth", "serve_dashboard"]

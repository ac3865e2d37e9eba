"""The dashboard's web server: a static page plus one JSON endpoint over a run directory.

Standard library only (``http.server``'s threading server in a daemon thread): the page polls
``/api/data?since=<seq>`` once a second and draws with uPlot, vendored under ``static/`` (MIT,
from the npm package ``uplot``), so it works offline. Loopback by default; any other address
requires a token (the rule of stratax's other servers): requests to the page and the data must
carry ``?token=...`` or ``Authorization: Bearer ...``; static library files are public. Without
a token, a request must name the server in its ``Host`` header (no DNS rebinding).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

from stratax._src.core import env as env_names
from stratax._src.core.addresses import is_loopback
from stratax._src.observe.reader import RunReader
from stratax._src.observe.run_dir import PathLike

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
_CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                  ".css": "text/css; charset=utf-8"}
_PUBLIC_FILES = frozenset({"uPlot.iife.min.js", "uPlot.min.css", "dashboard.js", "dashboard.css"})


class DashboardServer:
    """Serves the live dashboard of ``run_dir`` at :attr:`url` until :meth:`close`.

    Args:
        run_dir: the run directory to show (it may not exist yet: the page waits for data).
        host: address to bind; ``127.0.0.1`` by default. Any non-loopback address requires a
            token.
        port: TCP port; ``0`` picks a free one.
        token: required on non-loopback hosts; default ``$STRATAX_DASHBOARD_TOKEN``, else a
            random one (printed in :attr:`url`). Ignored on loopback unless given.

    Example:
        >>> server = DashboardServer("stratax_runs/run-1")  # doctest: +SKIP
        >>> print(server.url)  # open it in a browser  # doctest: +SKIP
        >>> server.close()  # doctest: +SKIP
    """

    def __init__(self, run_dir: PathLike, *, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in 0..65535 (0 = any free port), got {port!r}.")
        if token is None and not is_loopback(host):
            token = os.environ.get(env_names.STRATAX_DASHBOARD_TOKEN) or secrets.token_urlsafe(24)
        if token is not None and len(token) < 16:
            raise ValueError(
                f"The dashboard token must be at least 16 characters, got {len(token)}; use e.g. "
                f"python -c 'import secrets; print(secrets.token_urlsafe(24))'."
            )
        self.run_dir = Path(run_dir)
        self.token = token
        self.reader = RunReader(self.run_dir)
        self._page_polled = threading.Event()  # a page asked for data
        self._end_delivered = threading.Event()  # ... and has received the run's end
        handler = type("_BoundHandler", (_Handler,), {"dashboard": self})
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self.host = host
        self.port = int(self._httpd.server_address[1])
        # On loopback no token guards the page: a request must name this server in its Host
        # header, or a page of another site could read it by DNS rebinding.
        self._hosts = None if token is not None else {
            f"{name}:{self.port}" for name in ("127.0.0.1", "localhost", "[::1]", host)}
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name=f"stratax-dashboard:{self.port}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The page's address, with the token when one is required."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        query = f"?token={quote(self.token)}" if self.token else ""
        return f"http://{host}:{self.port}/{query}"

    def serve_until_seen(self, grace_seconds: float) -> bool:
        """After the run ended: keeps serving until a page that was polling has received the
        end of the run (its outcome and any failure's cause), at most ``grace_seconds``.

        Returns at once when no page polled (nobody is watching). Returns whether the end was
        delivered.
        """
        if not self._page_polled.is_set():
            return False
        return self._end_delivered.wait(max(grace_seconds, 0.0))

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request's ``Host`` header names this server (always true with a token)."""
        return self._hosts is None or (header or "").lower() in self._hosts

    def data(self, since: int) -> dict[str, object]:
        """The page's data since record ``since`` (see ``RunReader.snapshot``), noting what the
        page has seen."""
        snapshot = self.reader.snapshot(since)
        self._page_polled.set()
        if any(event.get("kind") == "end" for event in snapshot["events"]):
            self._end_delivered.set()
        return snapshot

    def close(self) -> None:
        """Stops serving and joins the server thread (bounded: 5 s)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)

    def __enter__(self) -> DashboardServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def authorized(self, query_token: str | None, header: str | None) -> bool:
        """Whether a request carries the token (always true without one)."""
        if self.token is None:
            return True
        offered = query_token or (header[7:] if header and header.startswith("Bearer ") else "")
        return hmac.compare_digest(offered.encode(), self.token.encode())


class _Handler(BaseHTTPRequestHandler):
    dashboard: DashboardServer
    server_version = "stratax-dashboard"

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        path = parts.path
        if not self.dashboard.host_allowed(self.headers.get("Host")):
            self._send(HTTPStatus.MISDIRECTED_REQUEST, b"this dashboard answers only requests "
                       b"addressed to it: open the URL the dashboard printed\n", "text/plain")
            return
        if path == "/favicon.ico":
            self._send(HTTPStatus.NO_CONTENT, b"", "text/plain")
            return
        if path.startswith("/static/") and path[len("/static/"):] in _PUBLIC_FILES:
            self._send_file(STATIC_DIR / path[len("/static/"):])
            return
        if not self.dashboard.authorized((query.get("token") or [None])[0],
                                         self.headers.get("Authorization")):
            self._send(HTTPStatus.UNAUTHORIZED, b"missing or wrong token: open the URL the "
                       b"dashboard printed (it ends with ?token=...)\n", "text/plain")
            return
        if path in ("/", "/index.html"):
            self._send_file(STATIC_DIR / "index.html")
        elif path == "/api/data":
            try:
                since = int((query.get("since") or ["0"])[0])
            except ValueError:
                self._send(HTTPStatus.BAD_REQUEST, b"since must be an integer\n", "text/plain")
                return
            body = json.dumps(self.dashboard.data(since)).encode()
            self._send(HTTPStatus.OK, body, "application/json")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    def _send_file(self, path: Path) -> None:
        self._send(HTTPStatus.OK, path.read_bytes(),
                   _CONTENT_TYPES.get(path.suffix, "application/octet-stream"))

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("dashboard %s: " + format, self.address_string(), *args)


def serve_dashboard(run_dir: PathLike, *, host: str = "127.0.0.1", port: int = 0,
                    token: str | None = None) -> DashboardServer:
    """Starts serving the dashboard of ``run_dir`` in a background thread; returns the server.

    Works on a live run (the page updates every second) and on a finished one. See
    :class:`DashboardServer` for the arguments; ``server.url`` is the page, ``server.close()``
    stops it.
    """
    return DashboardServer(run_dir, host=host, port=port, token=token)

"""The optional HTTP listener of a beat process: ``/livez``, ``/readyz``, ``/metrics``.

Started with the scheduler when ``singlebeat_http_port`` is set, on a daemon
thread of its own (the standard library's ``ThreadingHTTPServer``, one thread
per request), so a hung tick does not stop it answering: ``/livez`` then says
how long ago the loop last ran, which is the point of asking. Stopped by the
scheduler's ``close()``. The same server, without the probes, exposes a
prefork worker's multiprocess metrics
(:func:`celery_singlebeat.observe.metrics.serve_multiprocess`).

Nothing here prints a setting's value beyond the bind address and the port:
the bodies are the probes' one-line verdicts and the metrics' text.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..exceptions import ConfigurationError
from .telemetry import Telemetry

logger = logging.getLogger("celery_singlebeat.listener")

#: (status code, content type, body) of one GET
Answer = tuple[int, str, bytes]
#: a path's answer, given the request's Accept header (the metrics' format)
Route = Callable[[str], Answer]

TEXT = "text/plain; charset=utf-8"


def probe_route(check: Callable[[], tuple[bool, str]]) -> Route:
    """A route answering 200 when ``check`` holds, 503 otherwise, with its line."""

    def answer(_accept: str) -> Answer:
        ok, line = check()
        return (200 if ok else 503), TEXT, (line + "\n").encode()

    return answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    #: Routes by path; set before the first request.
    routes: Mapping[str, Route] = {}


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    #: a client that connects and says nothing is dropped after this long
    timeout = 10
    protocol_version = "HTTP/1.1"

    def version_string(self) -> str:
        # the Server header: no Python version for a scanner to read
        return "celery-singlebeat"

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _answer(self, with_body: bool) -> None:
        route = self.server.routes.get(self.path.partition("?")[0])
        if route is None:
            status, kind, body = 404, TEXT, b"not found: try /livez, /readyz or /metrics\n"
        else:
            try:
                status, kind, body = route(self.headers.get("Accept", ""))
            except Exception:  # a probe must answer, even about its own failure
                logger.exception("singlebeat: answering %s failed", self.path)
                status, kind, body = 500, TEXT, b"internal error (see the beat log)\n"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        # one line per probe every few seconds would drown beat's own log
        logger.debug("singlebeat: http %s - %s", self.address_string(), format % args)


class Listener(Telemetry):
    """A running HTTP server; its ``close()`` (the scheduler's) stops it."""

    def __init__(self, server: _Server, thread: threading.Thread) -> None:
        self.server = server
        self.thread = thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @classmethod
    def start(
        cls,
        bind: str,
        port: int,
        routes: Mapping[str, Route],
        setting: str = "singlebeat_http_port",
    ) -> Listener:
        """Listen on ``bind``:``port``; ConfigurationError naming ``setting``
        when that is impossible (the port in use, an address not of this host)."""
        server = cls._bind(bind, port, setting)
        server.routes = dict(routes)
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name=f"singlebeat-http-{port}",
            daemon=True,
        )
        thread.start()
        logger.info(
            "singlebeat: serving %s on http://%s:%d",
            ", ".join(sorted(routes)),
            bind if ":" not in bind else f"[{bind}]",
            server.server_address[1],
        )
        return cls(server, thread)

    @staticmethod
    def _bind(bind: str, port: int, setting: str) -> _Server:
        server_class = _Server6 if ":" in bind else _Server
        try:
            return server_class((bind, port), _Handler, bind_and_activate=True)
        except OSError as exc:
            why = (
                "the port is in use (by another process of this pod or host?): choose "
                f"another {setting}"
                if exc.errno == errno.EADDRINUSE
                else f"{exc.strerror or exc}: check singlebeat_http_bind and {setting}"
            )
            raise ConfigurationError(
                f"{setting}={port}: cannot listen on {bind}:{port}: {why}"
            ) from None

    @classmethod
    def check(cls, bind: str, port: int, setting: str = "singlebeat_http_port") -> None:
        """Fail as :meth:`start` would (the port in use...), listening for an
        instant only: ``celery beat``'s first, banner-only scheduler checks
        this before the banner, as it checks every setting."""
        cls._bind(bind, port, setting).server_close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


__all__ = ["Listener", "probe_route"]

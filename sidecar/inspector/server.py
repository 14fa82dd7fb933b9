"""The inspector's HTTP server: standard library, loopback or a unix socket only, GET only, one
read per page.

With tenants configured, a page is served only to a tenant's bearer token, given once as
``?token=`` (or an ``Authorization: Bearer`` header) and then kept in a session cookie; each
tenant sees its own runs, and another tenant's run answers 404 as a run that does not exist would.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import socketserver
import stat
import threading
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from sidecar.errors import NotFound, ValidationError
from sidecar.inspector import memory_view, pages, turn_view
from sidecar.memory.api import Memories
from sidecar.settings import DEFAULT_TENANT, AuthSettings, InspectorSettings, inspector_address
from sidecar.transcript.transcripts import Transcripts

log = logging.getLogger(__name__)
COOKIE = "inspector_token"
RUNS_PER_PAGE = 100  # the runs list's page: its runs alone are read whole


class Inspector:
    """The pages over ``transcripts`` and ``memories``, for the tenants of ``auth``; ``settings``:
    the timeline's page size and the prices its costs are modelled with."""

    def __init__(self, transcripts: Transcripts, memories: Memories, auth: AuthSettings,
                 settings: InspectorSettings | None = None, runs_per_page: int = RUNS_PER_PAGE) -> None:
        self._transcripts = transcripts
        self._memories = memories
        self._auth = auth
        self._settings = settings or InspectorSettings()
        self._runs_per_page = runs_per_page

    def tenant(self, token: str | None) -> str | None:
        """The tenant a request's token names (without tenants configured: the default one)."""
        if not self._auth.tenants:
            return DEFAULT_TENANT
        return self._auth.tenant_of_token(token) if token else None

    def answer(self, tenant: str, path: str, query: dict[str, list[str]]) -> tuple[HTTPStatus, str]:
        parts = [unquote(part) for part in path.strip("/").split("/")] if path.strip("/") else []
        try:
            if not parts:
                return self._runs(tenant, query.get("q", [""])[0], query.get("page", ["1"])[0])
            if parts[0] == "memory" and len(parts) <= 2:
                return memory_view.answer(self._memories, tenant, parts[1] if len(parts) == 2 else None, query)
            if len(parts) == 2 and parts[0] == "runs":
                return self._run(tenant, parts[1], query.get("page", ["1"])[0])
            if len(parts) == 4 and parts[0] == "runs" and parts[2] == "turns" and parts[3].isdigit():
                return HTTPStatus.OK, turn_view.turn_page(self._transcripts, tenant, parts[1], int(parts[3]), query)
            if len(parts) == 3 and parts[0] == "runs" and parts[2] == "events":
                return HTTPStatus.OK, turn_view.events_page(self._transcripts, tenant, parts[1], query)
        except (NotFound, ValidationError) as error:  # no such run of this tenant, or no such id at all
            return HTTPStatus.NOT_FOUND, pages.message_page("Not found", error.message)
        return HTTPStatus.NOT_FOUND, pages.message_page("Not found", f"no page at {path}")


    def _runs(self, tenant: str, search: str, asked: str) -> tuple[HTTPStatus, str]:
        """A page of the tenant's runs whose id contains ``search`` (``?page=``, from 1; a page past
        the last answers 404)."""
        page_number = int(asked) if asked.isdigit() else 0
        size = self._runs_per_page
        runs, total = self._transcripts.runs(tenant, search, max(page_number - 1, 0) * size, size)
        last = max(1, -(-total // size))  # no runs: one page, empty
        if not 1 <= page_number <= last:
            return HTTPStatus.NOT_FOUND, pages.message_page(
                "Not found", f"{last} page(s) of runs, not {asked!r}")
        return HTTPStatus.OK, pages.runs_page(runs, search, page_number, last, total)

    def _run(self, tenant: str, run_id: str, asked: str) -> tuple[HTTPStatus, str]:
        """A page of the run's timeline (``?page=``, from 1): a page past the last answers 404."""
        page_number = int(asked) if asked.isdigit() else 0
        size = self._settings.turns_per_page
        turns, total = self._transcripts.turns(tenant, run_id, max(page_number - 1, 0) * size, size)
        last = max(1, -(-total // size))  # a run without turns has one page, empty
        if not 1 <= page_number <= last:
            return HTTPStatus.NOT_FOUND, pages.message_page(
                "Not found", f"run {run_id!r} has {last} page(s) of turns, not {asked!r}")
        return HTTPStatus.OK, pages.run_page(run_id, turns, total, page_number, last, self._settings)


def _handler(inspector: Inspector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "context-sidecar-inspector"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            given = query.pop("token", [None])[0]
            header = self.headers.get("Authorization", "")
            cookie = SimpleCookie(self.headers.get("Cookie", "")).get(COOKIE)
            token = given or (header[7:] if header.lower().startswith("bearer ") else None) \
                or (unquote(cookie.value) if cookie else None)
            tenant = inspector.tenant(token)
            if tenant is None:
                self._send(HTTPStatus.UNAUTHORIZED, pages.token_page(wrong=token is not None))
            elif given is not None:  # kept in a cookie, and off the address bar
                self.send_response(HTTPStatus.SEE_OTHER)
                self.send_header("Set-Cookie", f"{COOKIE}={quote(given, safe='')}; HttpOnly; SameSite=Strict; Path=/")
                self.send_header("Location", url.path + (f"?{urlencode(query, doseq=True)}" if query else ""))
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self._send(*inspector.answer(tenant, url.path, query))

        def _send(self, status: HTTPStatus, body: str) -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            # Nothing of the page is fetched from elsewhere, and no other site may frame it.
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; "
                                                        "form-action 'self'; frame-ancestors 'none'")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def address_string(self) -> str:  # a unix socket's peer has no address
            return str(self.client_address[0]) if self.client_address else "unix socket"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
            log.debug("inspector: " + format, *args)

    return Handler


class _ThreadingHTTPServer6(ThreadingHTTPServer):
    """For an IPv6 loopback: the standard server binds IPv4 unless told otherwise."""

    address_family = socket.AF_INET6


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """HTTP over a unix socket that only its owner may connect to (the pages show every run of
    the store to whoever connects, as loopback does to this machine's users: a socket narrows
    that to the owner). Its file is made owner-only between bind and listen, before anyone can
    connect; a stale file (a socket nothing listens on, left by a process that was killed) is
    replaced, and anything else at the path is refused, never deleted."""

    daemon_threads = True

    def server_bind(self) -> None:
        path = str(self.server_address)
        _clear_stale_socket(path)
        super().server_bind()
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)


def _clear_stale_socket(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:  # nothing listens: left by a process that is gone
            os.unlink(path)
            return
    raise OSError(errno.EADDRINUSE, f"another process listens on {path}")


class InspectorServer:
    """The inspector, listening on ``listen`` (a loopback ``host:port`` or ``unix:PATH``);
    :meth:`stop` ends it (and removes its socket file)."""

    def __init__(self, inspector: Inspector, listen: str) -> None:
        address = inspector_address(listen)
        handler = _handler(inspector)
        try:
            if isinstance(address, str):
                self._http: socketserver.BaseServer = _UnixHTTPServer(address, handler)
            else:
                server_class = _ThreadingHTTPServer6 if ":" in address[0] else ThreadingHTTPServer
                self._http = server_class(address, handler)
        except OSError as error:
            raise OSError(f"cannot serve the inspector on {listen}: {error.strerror or error}") from None
        self._socket_path = address if isinstance(address, str) else None
        self._thread: threading.Thread | None = None
        if self._socket_path is None:
            host, port = self._http.socket.getsockname()[:2]  # type: ignore[attr-defined]
            self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"  # the port chosen for :0
        else:
            self.url = f"unix:{self._socket_path}"

    def start(self) -> InspectorServer:
        self._thread = threading.Thread(target=self._http.serve_forever, name="inspector", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        if self._thread:
            self._thread.join()
        if self._socket_path is not None:
            try:
                os.unlink(self._socket_path)
            except FileNotFoundError:
                pass

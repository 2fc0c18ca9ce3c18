"""The ``tsm serve`` web app: a JSON API, server-sent events, and the static page that uses them.

One background task refreshes the :class:`~tsm.views.snapshot.Snapshot` every ``interval`` seconds (one
batched call per scheduler, however many pages are open) and pushes it to every open page over
``/api/events``; it also records usage samples (:mod:`tsm.views.samples`) for the charts.

API (all JSON; ``{id}`` is an app handle, URL-encoded, or a bare app id):

=================================  ==============================================================
``GET /api/apps``                  the latest snapshot: ``{"taken", "calls", "errors", "apps": [...]}``
``GET /api/apps/{id}``             one app (404 when unknown)
``GET /api/apps/{id}/logs``        ``{"lines": [...]}``; query ``role``, ``k`` (replica, default 0),
                                   ``regex``, ``tail`` (last N lines, default 1000)
``GET /api/apps/{id}/logs/follow`` server-sent events, one ``data: "<line>"`` per line as written,
                                   ``event: end`` when the replica has ended; same query
``GET /api/apps/{id}/samples``     ``{"role/idx": [[t, cpu, mem_mb, gpu_mem_mb], ...]}``
``POST /api/apps/{id}/cancel``     cancels; needs header ``X-TSM: 1``; returns ``{"state"}``
``GET /api/events``                server-sent events: ``data: <snapshot JSON>`` per refresh
``GET /api/sweeps/{id}``           one sweep's page data: ``{"sweep", "axes", "metrics", "trials": [...]}``
                                   (see :func:`tsm.views.sweeps.sweep_page`; 404 when unknown)
``GET /sweep?id=SWEEP``            the sweep page: its trials table and a metric against each parameter
=================================  ==============================================================

**Access** (:class:`Guard`, in this order, on every request):

* **Host.** The ``Host`` header must name the server as it was bound (:class:`HostCheck`): on loopback
  ``localhost`` or the loopback address, on a wildcard address any IP literal or this machine's names, plus
  the names given with ``--allow-host``. A web page that rebinds its own DNS name to 127.0.0.1 sends its own
  name and is answered 421, so it never reaches the API, even with a browser on this host.
* **Token.** Every request must carry the token (``tsm serve`` always has one: given, or made up and printed
  in the URL, so no other user of the machine can read logs or cancel apps): ``Authorization: Bearer
  <token>``, the query parameter ``?token=``, or the cookie the page gets when opened with ``?token=``
  (HttpOnly, SameSite=Strict), compared in constant time. Anything else is answered 401.
* **State changes.** ``POST`` also needs the ``X-TSM`` header, which a cross-site form cannot send, so
  another web page cannot cancel apps through a browser on this host.

Every response says ``X-Frame-Options: DENY`` and carries a strict Content-Security-Policy (only this
origin's script, style, images and connections; ``frame-ancestors 'none'``, so the page with Cancel buttons
cannot be framed), ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer`` (the URL holds
the token).

**Bounds.** A log ``regex`` is matched with RE2 (``google-re2``: linear time, no backtracking, so
``(.+)+X`` costs what ``X`` costs) and at most :data:`MAX_REGEX` characters. ``tail`` keeps at most the last
``tail`` lines in memory while the log streams past (never the whole log; at most :data:`MAX_TAIL`). A
followed log goes through a queue of at most :data:`FOLLOW_QUEUE` lines: a client that does not read gets
``event: end`` saying it was too slow, and the stream closes. When a stream closes its reader thread stops and
the scheduler's follower (with its supervisor connection) is closed, at the follower's next wake-up.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import ipaddress
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tsm.views.samples import SampleRecorder
from tsm.views.snapshot import Snapshot, SnapshotCollector

STATIC = Path(__file__).parent / "static"
#: Seconds between two comment lines on an idle event stream (keeps proxies from closing it).
KEEPALIVE = 15.0
COOKIE = "tsm_token"
#: The longest log ``regex`` accepted, and the most lines ``tail`` keeps.
MAX_REGEX, MAX_TAIL = 512, 100_000
#: Lines a followed log may queue for a client before the client is told it is too slow and dropped.
FOLLOW_QUEUE = 10_000
#: Headers on every response: no framing, only this origin's resources, no sniffing, no referrer (the token).
SECURITY_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
     b"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class Hub:
    """The latest snapshot and a version number that pages wait on."""

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.version = 0
        self._cond = asyncio.Condition()

    async def publish(self, snap: Snapshot) -> None:
        async with self._cond:
            self.snapshot, self.version = snap, self.version + 1
            self._cond.notify_all()

    async def wait_newer(self, version: int, timeout: float) -> bool:
        """Wait until a snapshot newer than ``version`` exists; False on timeout."""
        async with self._cond:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._cond.wait_for(lambda: self.version > version), timeout)
            return self.version > version


class _NotReady(Exception):
    """Raised by a request handler while no snapshot exists yet: answered 503 with a line saying so."""


@dataclass(frozen=True)
class HostCheck:
    """Which ``Host`` headers the server answers: the names it was bound for (see the module doc).

    ``names`` are host names accepted as they are (lower case, no port); ``any_ip`` accepts any IP literal
    (a wildcard bind: a DNS-rebinding page always sends a *name*); ``ips`` the IP literals accepted otherwise.
    """

    names: frozenset[str] = field(default_factory=frozenset)
    ips: frozenset[str] = field(default_factory=frozenset)
    any_ip: bool = False

    @classmethod
    def for_bind(cls, host: str, extra: Iterable[str] = ()) -> HostCheck:
        """The check for a server bound to ``host`` (an address or a name), with ``extra`` names allowed."""
        import socket

        names = {n.lower().rstrip(".") for n in extra if n}
        ips: set[str] = set()
        any_ip = False
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            names.add(host.lower().rstrip("."))
            ip = None
        if ip is not None and ip.is_unspecified:
            any_ip = True
            for name in (socket.gethostname(), socket.getfqdn(), "localhost"):
                names.add(name.lower().rstrip("."))
        elif ip is not None:
            ips.add(str(ip))
            if ip.is_loopback:
                names.add("localhost")
                ips.update({"127.0.0.1", "::1"})
        elif host.lower() == "localhost":
            ips.update({"127.0.0.1", "::1"})
        return cls(frozenset(names), frozenset(ips), any_ip)

    def allows(self, header: str) -> bool:
        """Whether a request with ``Host: header`` is for this server."""
        name = header.strip().lower()
        if name.startswith("["):
            name = name[1:name.find("]")] if "]" in name else ""
        elif name.count(":") == 1:
            name = name.rsplit(":", 1)[0]
        name = name.rstrip(".")
        if not name:
            return False
        try:
            ip = str(ipaddress.ip_address(name))
        except ValueError:
            return name in self.names
        return self.any_ip or ip in self.ips


class Guard:
    """ASGI middleware: the Host check, the token, ``X-TSM`` on state changes, security headers on every answer."""

    def __init__(self, app: ASGIApp, token: str | None, hosts: HostCheck | None) -> None:
        self.app, self.token, self.hosts = app, token, hosts

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        req = Request(scope)
        if self.hosts is not None and not self.hosts.allows(req.headers.get("host", "")):
            await JSONResponse({"error": "this server does not answer for that Host name"},
                               status_code=421)(scope, receive, send_secured)
            return
        if self.token is not None:
            given = [req.query_params.get("token", ""), req.cookies.get(COOKIE, "")]
            auth = req.headers.get("authorization", "")
            if auth.lower().startswith("bearer "):
                given.append(auth[7:].strip())
            if not any(g and hmac.compare_digest(g.encode(), self.token.encode()) for g in given):
                await JSONResponse({"error": "a valid token is required (?token=... or Authorization: Bearer)"},
                                   status_code=401)(scope, receive, send_secured)
                return
        if req.method not in ("GET", "HEAD") and req.headers.get("x-tsm") != "1":
            await JSONResponse({"error": "requests that change state need the header X-TSM: 1"},
                               status_code=403)(scope, receive, send_secured)
            return
        await self.app(scope, receive, send_secured)


#: Older name of :class:`Guard`.
TokenGate = Guard


class _Closed(Exception):
    """Raised inside a follower (through its ``idle`` hook) to stop it once its stream has closed."""


def compile_regex(regex: str) -> Callable[[str], bool]:
    """A search function for a client's ``regex``: RE2, linear in the line's length; ValueError if refused."""
    if len(regex) > MAX_REGEX:
        raise ValueError(f"regex is longer than {MAX_REGEX} characters")
    try:
        import re2  # type: ignore[import-untyped,unused-ignore]
    except ImportError as e:
        raise ValueError("log filtering needs google-re2: pip install 'tsm[web]'") from e
    options = re2.Options()
    options.log_errors = False
    try:
        pattern = re2.compile(regex, options)
    except re2.error as e:
        why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(f"bad regex: {why}") from None
    return lambda line: pattern.search(line) is not None


def last_lines(lines: Iterator[str], tail: int, keep: Callable[[str], bool] | None) -> list[str]:
    """The last ``tail`` lines of ``lines`` that ``keep`` accepts (all when ``tail`` <= 0), holding only those."""
    window: collections.deque[str] = collections.deque(maxlen=tail if tail > 0 else None)
    try:
        for line in lines:
            line = line.rstrip("\n")
            if keep is None or keep(line):
                window.append(line)
    finally:
        close = getattr(lines, "close", None)
        if close is not None:
            close()
    return list(window)


def create_app(
    token: str | None = None, interval: float = 1.0, sample_interval: float = 5.0,
    collector: SnapshotCollector | None = None, runner: Any = None, hosts: HostCheck | None = None,
    recorder: SampleRecorder | None = None,
) -> Starlette:
    """The dashboard app. ``runner`` serves cancel and logs (default: a new one); ``collector`` the snapshots.

    ``token`` and ``hosts`` are the :class:`Guard`'s (``tsm serve`` always gives both); ``recorder`` the usage
    samples (default: one on the collector's store, made at start-up).
    """
    hub = Hub()
    state: dict[str, Any] = {}

    def the_runner() -> Any:
        if "runner" not in state:
            if runner is not None:
                state["runner"] = runner
            else:
                from tsm.runner.api import get_runner

                state["runner"] = get_runner()
        return state["runner"]

    async def ticker(col: SnapshotCollector, rec: SampleRecorder) -> None:
        while True:
            try:
                snap = await asyncio.to_thread(col.refresh)
                await asyncio.to_thread(rec.record, snap)
                await hub.publish(snap)
            except Exception as e:  # noqa: BLE001 - the dashboard keeps going and shows why
                prev = hub.snapshot
                await hub.publish(Snapshot(prev.taken if prev else 0.0, prev.apps if prev else [],
                                           errors={"refresh": f"{type(e).__name__}: {e}"}))
            await asyncio.sleep(interval)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        col = collector if collector is not None else await asyncio.to_thread(SnapshotCollector)
        rec = recorder if recorder is not None else await asyncio.to_thread(SampleRecorder, col.store, sample_interval)
        state["recorder"] = rec
        task = asyncio.create_task(ticker(col, rec))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if "runner" in state and runner is None:
                state["runner"].close()

    async def current() -> Snapshot:
        if hub.snapshot is None:
            await hub.wait_newer(0, 30)
        if hub.snapshot is None:  # the first refresh is still running (a slow squeue, an API timing out)
            raise _NotReady
        return hub.snapshot

    async def find(request: Request) -> tuple[Snapshot, Any]:
        snap = await current()
        return snap, snap.app(request.path_params["id"])

    def unknown(request: Request) -> JSONResponse:
        return JSONResponse({"error": f"unknown app {request.path_params['id']}"}, status_code=404)

    def page(request: Request, name: str) -> Response:
        resp: Response = FileResponse(STATIC / name, headers={"Cache-Control": "no-store"})
        if token is not None and request.query_params.get("token"):
            resp.set_cookie(COOKIE, request.query_params["token"], httponly=True, samesite="strict")
        return resp

    async def index(request: Request) -> Response:
        return page(request, "index.html")

    async def sweep_html(request: Request) -> Response:
        return page(request, "sweep.html")

    async def sweep_one(request: Request) -> Response:
        from tsm.views.sweeps import sweep_page

        handle = request.path_params["id"]
        data = await asyncio.to_thread(sweep_page, handle)
        if data is None:
            return JSONResponse({"error": f"unknown sweep {handle}"}, status_code=404)
        return JSONResponse(data)

    async def apps(request: Request) -> Response:
        return JSONResponse((await current()).to_dict())

    async def app_one(request: Request) -> Response:
        snap, app = await find(request)
        return unknown(request) if app is None else JSONResponse(app.to_dict(snap.taken))

    def log_query(request: Request, app: Any) -> tuple[str, int, Callable[[str], bool] | None]:
        q = request.query_params
        role = q.get("role") or (app.replicas[0].role if app.replicas else "")
        try:
            k = int(q.get("k", "0"))
        except ValueError as e:
            raise ValueError(f"k must be a replica number, not {q.get('k')!r}") from e
        regex = q.get("regex") or None
        return role, k, None if regex is None else compile_regex(regex)

    async def logs(request: Request) -> Response:
        _, app = await find(request)
        if app is None:
            return unknown(request)
        try:
            role, k, keep = log_query(request, app)
            tail = int(request.query_params.get("tail", "1000"))
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        tail = MAX_TAIL if tail <= 0 or tail > MAX_TAIL else tail

        def read() -> list[str]:
            return last_lines(iter(the_runner().log_lines(app.handle, role, k)), tail, keep)

        try:
            lines = await asyncio.to_thread(read)
        except Exception as e:  # noqa: BLE001 - an unknown role or replica is the caller's error
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=400)
        return JSONResponse({"role": role, "k": k, "lines": lines})

    def follower(handle: str, role: str, k: int, stop: threading.Event) -> Iterator[str]:
        """The lines of a replica as written; stoppable from outside through the follower's ``idle`` hook."""
        from tsm.schedulers.api import MultiReplicaLogs
        from tsm.specs.handles import parse_app_handle

        r = the_runner()
        parsed = parse_app_handle(handle)
        sched = r.scheduler(parsed.scheduler_backend)
        if isinstance(sched, MultiReplicaLogs):
            def idle() -> None:
                if stop.is_set():
                    raise _Closed
            lines: Iterator[str] = iter(sched.log_iter_many(parsed.app_id, [(role, k)], should_tail=True,
                                                             idle=idle, text_only=True))
            return lines
        return iter(r.log_lines(handle, role, k, should_tail=True))

    async def follow(request: Request) -> Response:
        _, app = await find(request)
        if app is None:
            return unknown(request)
        try:
            role, k, keep = log_query(request, app)
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue(maxsize=FOLLOW_QUEUE + 1)
        stop = threading.Event()

        def offer(item: tuple[str, str]) -> None:
            # on the event loop: a full queue means the client stopped reading; tell it and drop it
            if stop.is_set():
                return
            if item[0] == "line" and queue.qsize() >= FOLLOW_QUEUE:
                stop.set()  # the follower ends; the client gets this message once it reads again
                item = ("end", f"dropped: this client read too slowly ({FOLLOW_QUEUE} lines waited for it)")
            queue.put_nowait(item)  # room: at most FOLLOW_QUEUE lines and one end

        def pump() -> None:
            # Blocks in the scheduler's own follower (event-driven for local logs). Once the stream closes,
            # ``stop`` ends it at its next line or wake-up, and closing the follower releases its connection.
            lines: Iterator[str] | None = None
            try:
                lines = follower(app.handle, role, k, stop)
                for line in lines:
                    if stop.is_set():
                        return
                    line = line.rstrip("\n")
                    if keep is None or keep(line):
                        loop.call_soon_threadsafe(offer, ("line", line))
                loop.call_soon_threadsafe(offer, ("end", ""))
            except _Closed:
                return
            except Exception as e:  # noqa: BLE001 - shown on the page as the stream's end
                if not stop.is_set():
                    with contextlib.suppress(RuntimeError):  # the loop is gone: the server is stopping
                        loop.call_soon_threadsafe(offer, ("end", f"{type(e).__name__}: {e}"))
            finally:
                close = getattr(lines, "close", None)
                if close is not None:
                    with contextlib.suppress(Exception):
                        close()

        threading.Thread(target=pump, name=f"follow {app.handle}", daemon=True).start()

        async def events() -> AsyncIterator[str]:
            try:
                while True:
                    try:
                        kind, text = await asyncio.wait_for(queue.get(), KEEPALIVE)
                    except asyncio.TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    if kind == "end":
                        yield f"event: end\ndata: {json.dumps(text)}\n\n"
                        return
                    yield f"data: {json.dumps(text)}\n\n"
            finally:
                stop.set()

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def samples(request: Request) -> Response:
        _, app = await find(request)
        if app is None:
            return unknown(request)
        return JSONResponse(await asyncio.to_thread(state["recorder"].samples, app.handle))

    async def cancel(request: Request) -> Response:
        _, app = await find(request)
        if app is None:
            return unknown(request)

        def stop_it() -> str:
            r = the_runner()
            r.cancel(app.handle)
            status = r.status(app.handle)
            return "UNKNOWN" if status is None else str(status.state.name)

        from tsm.errors import TsmError

        try:
            state = await asyncio.to_thread(stop_it)
        except TsmError as e:  # the scheduler refused or is down: say why, as JSON, not a bare 500
            return JSONResponse({"handle": app.handle, "error": str(e)}, status_code=502)
        return JSONResponse({"handle": app.handle, "state": state})

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            seen = 0
            while True:
                if await hub.wait_newer(seen, KEEPALIVE):
                    seen = hub.version
                    assert hub.snapshot is not None
                    yield f"data: {json.dumps(hub.snapshot.to_dict())}\n\n"
                else:
                    yield ": keep-alive\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    routes = [
        Route("/", index),
        Route("/api/apps", apps),
        Route("/api/events", events),
        Route("/sweep", sweep_html),
        Route("/api/sweeps/{id:path}", sweep_one),
        Route("/api/apps/{id:path}/logs/follow", follow),
        Route("/api/apps/{id:path}/logs", logs),
        Route("/api/apps/{id:path}/samples", samples),
        Route("/api/apps/{id:path}/cancel", cancel, methods=["POST"]),
        Route("/api/apps/{id:path}", app_one),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    async def not_ready(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": "the first refresh is still running; try again shortly"}, status_code=503,
                            headers={"Retry-After": "2"})

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={_NotReady: not_ready})
    app.add_middleware(Guard, token=token, hosts=hosts)
    return app

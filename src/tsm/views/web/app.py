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
=================================  ==============================================================

**Access.** When a token is set every request must carry it: ``Authorization: Bearer <token>``, the
query parameter ``?token=``, or the cookie the page gets when opened with ``?token=`` (HttpOnly,
SameSite=Strict). Anything else is answered 401. ``POST`` also needs the ``X-TSM`` header, which a
cross-site form cannot send, so another web page cannot cancel apps through a browser on this host.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
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


class TokenGate:
    """ASGI middleware: refuse requests without the token (when one is set) and POSTs without ``X-TSM``."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        req = Request(scope)
        if self.token is not None:
            given = [req.query_params.get("token", ""), req.cookies.get(COOKIE, "")]
            auth = req.headers.get("authorization", "")
            if auth.lower().startswith("bearer "):
                given.append(auth[7:].strip())
            if not any(g and hmac.compare_digest(g.encode(), self.token.encode()) for g in given):
                await JSONResponse({"error": "a valid token is required (?token=... or Authorization: Bearer)"},
                                   status_code=401)(scope, receive, send)
                return
        if req.method not in ("GET", "HEAD") and req.headers.get("x-tsm") != "1":
            await JSONResponse({"error": "requests that change state need the header X-TSM: 1"},
                               status_code=403)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(
    token: str | None = None, interval: float = 1.0, sample_interval: float = 5.0,
    collector: SnapshotCollector | None = None, runner: Any = None,
) -> Starlette:
    """The dashboard app. ``runner`` serves cancel and logs (default: a new one); ``collector`` the snapshots."""
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
        rec = await asyncio.to_thread(SampleRecorder, col.store, sample_interval)
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
        assert hub.snapshot is not None
        return hub.snapshot

    async def find(request: Request) -> tuple[Snapshot, Any]:
        snap = await current()
        return snap, snap.app(request.path_params["id"])

    def unknown(request: Request) -> JSONResponse:
        return JSONResponse({"error": f"unknown app {request.path_params['id']}"}, status_code=404)

    async def index(request: Request) -> Response:
        resp: Response = FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})
        if token is not None and request.query_params.get("token"):
            resp.set_cookie(COOKIE, request.query_params["token"], httponly=True, samesite="strict")
        return resp

    async def apps(request: Request) -> Response:
        return JSONResponse((await current()).to_dict())

    async def app_one(request: Request) -> Response:
        snap, app = await find(request)
        return unknown(request) if app is None else JSONResponse(app.to_dict(snap.taken))

    def log_query(request: Request, app: Any) -> tuple[str, int, str | None]:
        q = request.query_params
        role = q.get("role") or (app.replicas[0].role if app.replicas else "")
        try:
            k = int(q.get("k", "0"))
        except ValueError as e:
            raise ValueError(f"k must be a replica number, not {q.get('k')!r}") from e
        return role, k, q.get("regex") or None

    async def logs(request: Request) -> Response:
        _, app = await find(request)
        if app is None:
            return unknown(request)
        try:
            role, k, regex = log_query(request, app)
            tail = int(request.query_params.get("tail", "1000"))
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)

        def read() -> list[str]:
            lines = [ln.rstrip("\n") for ln in the_runner().log_lines(app.handle, role, k, regex)]
            return lines[-tail:] if tail > 0 else lines

        try:
            lines = await asyncio.to_thread(read)
        except Exception as e:  # noqa: BLE001 - a bad regex or unknown role is the caller's error
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=400)
        return JSONResponse({"role": role, "k": k, "lines": lines})

    async def follow(request: Request) -> Response:
        _, app = await find(request)
        if app is None:
            return unknown(request)
        try:
            role, k, regex = log_query(request, app)
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        stop = threading.Event()

        def pump() -> None:
            # Blocks in the scheduler's own follower (event-driven for local logs). After the page goes
            # away the thread ends at the replica's next line or its end, whichever comes first.
            try:
                for line in the_runner().log_lines(app.handle, role, k, regex, should_tail=True):
                    if stop.is_set():
                        return
                    loop.call_soon_threadsafe(queue.put_nowait, ("line", line.rstrip("\n")))
                loop.call_soon_threadsafe(queue.put_nowait, ("end", ""))
            except Exception as e:  # noqa: BLE001 - shown on the page as the stream's end
                loop.call_soon_threadsafe(queue.put_nowait, ("end", f"{type(e).__name__}: {e}"))

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

        return JSONResponse({"handle": app.handle, "state": await asyncio.to_thread(stop_it)})

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
        Route("/api/apps/{id:path}/logs/follow", follow),
        Route("/api/apps/{id:path}/logs", logs),
        Route("/api/apps/{id:path}/samples", samples),
        Route("/api/apps/{id:path}/cancel", cancel, methods=["POST"]),
        Route("/api/apps/{id:path}", app_one),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(TokenGate, token=token)
    return app

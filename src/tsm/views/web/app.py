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
``GET /api/apps/{id}/stack``       py-spy stacks of its live replicas (query ``role``, ``k``: narrower), as
                                   ``tsm stack --json`` prints them plus ``text``; needs ``X-TSM: 1``
                                   (this page's own request only), one at a time (409 while one runs)
``GET /api/events``                server-sent events: ``data: <snapshot JSON>`` per refresh
``GET /api/sweeps/{id}``           one sweep's page data: ``{"sweep", "axes", "metrics", "trials": [...]}``
                                   (see :func:`tsm.views.sweeps.sweep_page`; 404 when unknown)
``GET /``                          the page (``static/``); it keeps what it shows in the URL's fragment:
                                   ``#/app/{handle}[/{role}/{k}]``, ``#/sweep/{handle}``, filters after ``?``
``GET /sweep?id=SWEEP``            the same page, opened on that sweep
=================================  ==============================================================

Who may ask (the Host check, the token, ``X-TSM`` on ``POST``, the security headers) is
:mod:`tsm.views.web.guard`; how logs are bounded (RE2 regexes, tails held in a window, a followed log's
bounded queue) is :mod:`tsm.views.web.logs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from tsm.schedulers.common.viewmodel import AppSummary
from tsm.views.samples import SampleRecorder
from tsm.views.snapshot import Snapshot, SnapshotCollector
from tsm.views.web.guard import COOKIE, SECURITY_HEADERS, Guard, HostCheck, TokenGate
from tsm.views.web.logs import (
    FOLLOW_QUEUE,
    KEEPALIVE,
    MAX_REGEX,
    MAX_TAIL,
    FollowStream,
    LogQuery,
    compile_regex,
    last_lines,
    open_follower,
    tail_of,
)

__all__ = [
    "COOKIE", "FOLLOW_QUEUE", "KEEPALIVE", "MAX_REGEX", "MAX_TAIL", "SECURITY_HEADERS", "STATIC", "Dashboard",
    "Guard", "HostCheck", "Hub", "TokenGate", "compile_regex", "create_app", "last_lines",
]

STATIC = Path(__file__).parent / "static"
#: Seconds the first request waits for the first refresh before it is answered 503.
FIRST_REFRESH_WAIT = 30.0


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


class _Unknown(Exception):
    """Raised by a request handler for an app the snapshot does not hold: answered 404 naming it."""


def _sse(stream: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-store"})


class Dashboard:
    """The server's state (the hub, the collector, the sample recorder, a runner) and its request handlers.

    ``runner`` serves cancel and logs (default: one made on first use, closed at shutdown); ``collector`` makes
    the snapshots and ``recorder`` keeps the usage samples (defaults: made at start-up, on the collector's store).
    """

    def __init__(self, token: str | None = None, interval: float = 1.0, sample_interval: float = 5.0,
                 collector: SnapshotCollector | None = None, runner: Any = None,
                 recorder: SampleRecorder | None = None) -> None:
        self.token, self.interval, self.sample_interval = token, interval, sample_interval
        self.collector, self.recorder = collector, recorder
        self.hub = Hub()
        self._given_runner = runner
        self._runner: Any = runner
        self.stack_lock = asyncio.Lock()  # one py-spy round at a time, whatever the pages ask

    @property
    def runner(self) -> Any:
        if self._runner is None:
            from tsm.runner.api import get_runner

            self._runner = get_runner()
        return self._runner

    # -- the refresh ---------------------------------------------------------------------------------
    async def ticker(self, col: SnapshotCollector, rec: SampleRecorder) -> None:
        """Refresh, record samples and publish every ``interval`` seconds; a failed refresh is published as an error."""
        while True:
            try:
                snap = await asyncio.to_thread(col.refresh)
                await asyncio.to_thread(rec.record, snap)
                await self.hub.publish(snap)
            except Exception as e:  # noqa: BLE001 - the dashboard keeps going and shows why
                prev = self.hub.snapshot
                await self.hub.publish(Snapshot(prev.taken if prev else 0.0, prev.apps if prev else [],
                                                errors={"refresh": f"{type(e).__name__}: {e}"}))
            await asyncio.sleep(self.interval)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        if self.collector is None:
            self.collector = await asyncio.to_thread(SnapshotCollector)
        if self.recorder is None:
            self.recorder = await asyncio.to_thread(SampleRecorder, self.collector.store, self.sample_interval)
        task = asyncio.create_task(self.ticker(self.collector, self.recorder))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if self._runner is not None and self._given_runner is None:
                self._runner.close()

    async def current(self) -> Snapshot:
        """The latest snapshot, waiting for the first one a while (then :class:`_NotReady`)."""
        if self.hub.snapshot is None:
            await self.hub.wait_newer(0, FIRST_REFRESH_WAIT)
        if self.hub.snapshot is None:  # the first refresh is still running (a slow squeue, an API timing out)
            raise _NotReady
        return self.hub.snapshot

    async def app_of(self, request: Request) -> tuple[Snapshot, AppSummary]:
        """The snapshot and the app ``{id}`` names (:class:`_Unknown` when it holds none)."""
        snap = await self.current()
        app = snap.app(request.path_params["id"])
        if app is None:
            raise _Unknown
        return snap, app

    # -- the page and the snapshot -------------------------------------------------------------------
    async def page(self, request: Request) -> Response:
        """The page; opened with ``?token=``, it also sets the token's cookie for its own requests."""
        resp: Response = FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})
        if self.token is not None and request.query_params.get("token"):
            resp.set_cookie(COOKIE, request.query_params["token"], httponly=True, samesite="strict")
        return resp

    async def apps(self, request: Request) -> Response:
        return JSONResponse((await self.current()).to_dict())

    async def app_one(self, request: Request) -> Response:
        snap, app = await self.app_of(request)
        return JSONResponse(app.to_dict(snap.taken))

    async def events(self, request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            seen = 0
            while True:
                if await self.hub.wait_newer(seen, KEEPALIVE):
                    seen = self.hub.version
                    assert self.hub.snapshot is not None
                    yield f"data: {json.dumps(self.hub.snapshot.to_dict())}\n\n"
                else:
                    yield ": keep-alive\n\n"

        return _sse(stream())

    async def sweep_one(self, request: Request) -> Response:
        from tsm.views.sweeps import sweep_page

        handle = request.path_params["id"]
        data = await asyncio.to_thread(sweep_page, handle)
        if data is None:
            return JSONResponse({"error": f"unknown sweep {handle}"}, status_code=404)
        return JSONResponse(data)

    async def samples(self, request: Request) -> Response:
        _, app = await self.app_of(request)
        assert self.recorder is not None  # made at start-up
        return JSONResponse(await asyncio.to_thread(self.recorder.samples, app.handle))

    # -- logs and cancel -----------------------------------------------------------------------------
    async def logs(self, request: Request) -> Response:
        _, app = await self.app_of(request)
        try:
            q = LogQuery.parse(request.query_params, app.replicas[0].role if app.replicas else "")
            tail = tail_of(request.query_params)
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)

        def read() -> list[str]:
            return last_lines(iter(self.runner.log_lines(app.handle, q.role, q.k)), tail, q.keep)

        try:
            lines = await asyncio.to_thread(read)
        except Exception as e:  # noqa: BLE001 - an unknown role or replica is the caller's error
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=400)
        return JSONResponse({"role": q.role, "k": q.k, "lines": lines})

    async def follow(self, request: Request) -> Response:
        _, app = await self.app_of(request)
        try:
            q = LogQuery.parse(request.query_params, app.replicas[0].role if app.replicas else "")
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        stream = FollowStream(lambda stop: open_follower(self.runner, app.handle, q.role, q.k, stop), q.keep,
                              asyncio.get_running_loop())
        stream.start(f"follow {app.handle}")
        return _sse(stream.events())

    async def stack(self, request: Request) -> Response:
        from tsm.views.web.stack import take_stack

        _, app = await self.app_of(request)
        return await take_stack(self.runner, app.handle, request, self.stack_lock)

    async def cancel(self, request: Request) -> Response:
        from tsm.errors import TsmError

        _, app = await self.app_of(request)

        def stop_it() -> str:
            self.runner.cancel(app.handle)
            status = self.runner.status(app.handle)
            return "UNKNOWN" if status is None else str(status.state.name)

        try:
            state = await asyncio.to_thread(stop_it)
        except TsmError as e:  # the scheduler refused or is down: say why, as JSON, not a bare 500
            return JSONResponse({"handle": app.handle, "error": str(e)}, status_code=502)
        return JSONResponse({"handle": app.handle, "state": state})

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/", self.page),
            Route("/sweep", self.page),
            Route("/api/apps", self.apps),
            Route("/api/events", self.events),
            Route("/api/sweeps/{id:path}", self.sweep_one),
            Route("/api/apps/{id:path}/logs/follow", self.follow),
            Route("/api/apps/{id:path}/logs", self.logs),
            Route("/api/apps/{id:path}/samples", self.samples),
            Route("/api/apps/{id:path}/cancel", self.cancel, methods=["POST"]),
            Route("/api/apps/{id:path}/stack", self.stack),
            Route("/api/apps/{id:path}", self.app_one),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]


async def _not_ready(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": "the first refresh is still running; try again shortly"}, status_code=503,
                        headers={"Retry-After": "2"})


async def _unknown(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": f"unknown app {request.path_params.get('id', '')}"}, status_code=404)


def create_app(
    token: str | None = None, interval: float = 1.0, sample_interval: float = 5.0,
    collector: SnapshotCollector | None = None, runner: Any = None, hosts: HostCheck | None = None,
    recorder: SampleRecorder | None = None,
) -> Starlette:
    """The dashboard app (a :class:`Dashboard`'s routes behind the :class:`~tsm.views.web.guard.Guard`).

    ``token`` and ``hosts`` are the guard's (``tsm serve`` always gives both); the others the
    :class:`Dashboard`'s.
    """
    board = Dashboard(token, interval, sample_interval, collector, runner, recorder)
    app = Starlette(routes=board.routes(), lifespan=board.lifespan,
                    exception_handlers={_NotReady: _not_ready, _Unknown: _unknown})
    app.add_middleware(Guard, token=token, hosts=hosts)
    return app

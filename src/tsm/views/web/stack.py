"""``GET /api/apps/{id}/stack``: the dashboard's Stack tab, ``tsm stack`` for the page that asks.

What the endpoint may do is narrower than the command: it only reads (py-spy dumps through
``Runner.replica_stacks``), never runs a command in a replica; it answers the page's own requests only (the
``X-TSM: 1`` header, which a cross-site page cannot send without the browser asking this server first, and
the guard's token and Host check before it); and it is bounded: one round of dumps at a time per server (a
second request meanwhile is answered 409) and :data:`STACK_TIMEOUT` seconds for the round.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

#: Seconds one round of dumps may take before the page is told it timed out.
STACK_TIMEOUT = 60.0


def _target(request: Request) -> tuple[str | None, int | None]:
    """The ``role`` and ``k`` of the query (both optional); a bad one raises ValueError."""
    from tsm.specs.validate import NAME_RE

    role = request.query_params.get("role") or None
    k_text = request.query_params.get("k")
    if role is not None and not NAME_RE.match(role):
        raise ValueError("role must be a role name")
    if k_text is not None and not (k_text.isascii() and k_text.isdigit() and len(k_text) <= 9):
        raise ValueError("k must be a replica index")
    if k_text is not None and role is None:
        raise ValueError("k needs role")
    return role, int(k_text) if k_text is not None else None


async def take_stack(runner: Any, handle: str, request: Request, lock: asyncio.Lock) -> Response:
    """The stacks of ``handle``'s replicas as JSON (``to_json()`` of the report, plus its ``text``)."""
    from tsm.errors import NotSupportedError, ReplicaNotRunningError, TsmError
    from tsm.runner.stacks import render

    if request.headers.get("x-tsm") != "1":
        return JSONResponse({"error": "stacks are only for this dashboard's page (header X-TSM: 1)"}, status_code=403)
    try:
        role, k = _target(request)
    except ValueError as e:
        return JSONResponse({"error": str(e)}, status_code=400)
    if lock.locked():
        return JSONResponse({"error": "a stack is being taken; try again when it is done"}, status_code=409)
    async with lock:
        try:
            report = await asyncio.wait_for(asyncio.to_thread(runner.replica_stacks, handle, role, k), STACK_TIMEOUT)
        except asyncio.TimeoutError:
            return JSONResponse({"error": f"the dumps took longer than {STACK_TIMEOUT:.0f} s"}, status_code=504)
        except ReplicaNotRunningError as e:
            return JSONResponse({"error": str(e)}, status_code=409)
        except NotSupportedError as e:
            return JSONResponse({"error": str(e)}, status_code=501)
        except TsmError as e:  # an unknown role or replica, py-spy missing here, a scheduler down
            return JSONResponse({"error": str(e)}, status_code=400)
    return JSONResponse({**report.to_json(), "text": render(report),
                         "errors": [f"{name}: {why}" for name, why in report.errors]})

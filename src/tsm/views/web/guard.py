"""Who ``tsm serve`` answers: the ``Host`` check, the token, ``X-TSM`` on state changes, and the security headers.

:class:`Guard` is ASGI middleware applied to every request, in this order:

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

Every answer says ``X-Frame-Options: DENY`` and carries a strict Content-Security-Policy (only this origin's
script, style, images and connections; ``frame-ancestors 'none'``, so the page with Cancel buttons cannot be
framed), ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer`` (the URL may hold the token).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

#: The cookie that carries the token for the page's own requests.
COOKIE = "tsm_token"
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

    def refusal(self, req: Request) -> JSONResponse | None:
        """The answer a request gets instead of the app's (421, 401, 403), or None when it may pass."""
        if self.hosts is not None and not self.hosts.allows(req.headers.get("host", "")):
            return JSONResponse({"error": "this server does not answer for that Host name"}, status_code=421)
        if self.token is not None:
            given = [req.query_params.get("token", ""), req.cookies.get(COOKIE, "")]
            auth = req.headers.get("authorization", "")
            if auth.lower().startswith("bearer "):
                given.append(auth[7:].strip())
            if not any(g and hmac.compare_digest(g.encode(), self.token.encode()) for g in given):
                return JSONResponse({"error": "a valid token is required (?token=... or Authorization: Bearer)"},
                                    status_code=401)
        if req.method not in ("GET", "HEAD") and req.headers.get("x-tsm") != "1":
            return JSONResponse({"error": "requests that change state need the header X-TSM: 1"}, status_code=403)
        return None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        refused = self.refusal(Request(scope))
        if refused is not None:
            await refused(scope, receive, send_secured)
            return
        await self.app(scope, receive, send_secured)


#: Older name of :class:`Guard`.
TokenGate = Guard

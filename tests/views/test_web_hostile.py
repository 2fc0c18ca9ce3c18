"""``tsm serve`` attacked as a hostile web page, another user of the machine and a greedy client would.

Each case is a row of the README's reliability table (``make harden``), against a real server process and real
local apps. Memory is read from the server's ``/proc/<pid>/status`` (peak resident set, ``VmHWM``); threads
from ``/proc/<pid>/task``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from testutil import HANG
from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, Resource, Role

from .serving import auth, base, serve_process, token, tsm_serve, wait_for

httpx = pytest.importorskip("httpx")
SECURITY, HOSTILE, LOAD, FAULTS = "Security", "Hostile input", "Load", "Faults"


def py(code: str, name: str = "r") -> Role:
    return Role(name, image=".", entrypoint=sys.executable, args=["-u", "-c", textwrap.dedent(code)],
                resource=Resource(cpu=1, gpu=0, memMB=128))


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner() as r:
        yield r


def app_url(url: str, handle: str, suffix: str = "") -> str:
    return base(url) + "api/apps/" + quote(handle, safe="") + suffix


def listed(http: Any, url: str, handle: str, state: str = "RUNNING") -> Any:
    apps = http.get(base(url) + "api/apps").json()["apps"]
    return next((a for a in apps if a["handle"] == handle and a["state"] == state), None)


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def unix_sockets(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return n


@pytest.mark.reliability(
    "DNS rebinding: a page that rebinds its name to 127.0.0.1",
    expect="a Host header that is not the bound address or localhost is answered 421, even with the token",
    group=SECURITY,
)
def test_dns_rebinding_host_is_refused() -> None:
    with tsm_serve() as url, httpx.Client(timeout=30, headers=auth(url)) as http:
        port = base(url).rsplit(":", 1)[1].rstrip("/")
        for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}", ""):
            r = http.get(base(url) + "api/apps", headers={"Host": host})
            assert r.status_code == 421, (host, r.status_code)
            r = http.post(base(url) + "api/apps/local%3A%2F%2Fdefault%2Fx/cancel", headers={"Host": host, "X-TSM": "1"})
            assert r.status_code == 421
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST."):
            assert http.get(base(url) + "api/apps", headers={"Host": host}).status_code == 200, host
    with tsm_serve("--allow-host", "tsm.internal") as url, httpx.Client(timeout=30, headers=auth(url)) as http:
        assert http.get(base(url) + "api/apps", headers={"Host": "tsm.internal:443"}).status_code == 200


PROBE = """
import json, os, sys, urllib.request, urllib.error
root, handle = sys.argv[1], sys.argv[2]
try:  # once before switching users: Python imports what a request needs lazily, and "nobody" cannot read it
    urllib.request.urlopen(root + "static/app.css", timeout=30)
except urllib.error.HTTPError:
    pass
if os.geteuid() == 0:
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
out = {}
for name, req in {
    "apps": urllib.request.Request(root + "api/apps"),
    "logs": urllib.request.Request(root + "api/apps/" + handle + "/logs"),
    "cancel": urllib.request.Request(root + "api/apps/" + handle + "/cancel", method="POST", headers={"X-TSM": "1"}),
}.items():
    try:
        out[name] = urllib.request.urlopen(req, timeout=30).status
    except urllib.error.HTTPError as e:
        out[name] = e.code
print(json.dumps(out))
"""


@pytest.mark.reliability(
    "another user of the machine, on loopback",
    expect="a token is always required (made up and printed when none is given): another uid lists, reads and cancels nothing",
    group=SECURITY,
)
def test_another_user_gets_nothing_on_loopback(runner: Runner) -> None:
    handle = runner.run(AppDef("mine", [py("import time\nprint('secret', flush=True)\ntime.sleep(300)")]), "local")
    try:
        with tsm_serve() as url:
            assert len(token(url)) >= 24  # made up: nobody passed one
            out = subprocess.run([sys.executable, "-c", PROBE, base(url), quote(handle, safe="")],
                                 capture_output=True, text=True, timeout=HANG)
            got = json.loads(out.stdout)
            assert got == {"apps": 401, "logs": 401, "cancel": 401}, got
            assert runner.status(handle).state.name == "RUNNING"
    finally:
        runner.cancel(handle)


@pytest.mark.reliability(
    "regex denial of service in a log request",
    expect="regex=(.+)+X over 40-character lines answers at once (RE2, no backtracking); the server stays responsive",
    group=HOSTILE,
)
def test_regex_cannot_freeze_the_server(runner: Runner, figure) -> None:  # type: ignore[no-untyped-def]
    handle = runner.run(AppDef("redos", [py("import time\nfor _ in range(50): print('a' * 40, flush=True)\n"
                                            "time.sleep(300)")]), "local")
    try:
        with tsm_serve() as url, httpx.Client(timeout=60, headers=auth(url)) as http:
            wait_for(lambda: listed(http, url, handle), what="app listed")
            wait_for(lambda: len(http.get(app_url(url, handle, "/logs")).json()["lines"]) >= 50, what="50 lines")
            t0 = time.monotonic()
            try:
                r = http.get(app_url(url, handle, "/logs"), params={"regex": "(.+)+X"})
            except httpx.TimeoutException:
                pytest.fail("the regex froze the server for over 60 s")
            figure("(.+)+X over 50 lines", time.monotonic() - t0, "s", limit=1.0)
            assert r.status_code == 200 and r.json()["lines"] == []
            assert http.get(app_url(url, handle, "/logs"), params={"regex": "a{40}$"}).json()["lines"] == ["a" * 40] * 50
            bad = http.get(app_url(url, handle, "/logs"), params={"regex": "(a"})
            assert bad.status_code == 400 and "regex" in bad.json()["error"]
            assert http.get(app_url(url, handle, "/logs"), params={"regex": "a" * 10_000}).status_code == 400
            assert http.get(base(url) + "api/apps").status_code == 200
    finally:
        runner.cancel(handle)


BIG_LOG = """
import time
line = 'x' * 199
for i in range(200_000):
    print(line)
print('last line', flush=True)
time.sleep(300)
"""


@pytest.mark.reliability(
    "memory: tail of a 40 MB log, and a follower that never reads",
    expect="logs?tail=1 keeps only the tail (server peak grows < 24 MiB); a client that stops reading is dropped with a message",
    group=LOAD,
)
def test_tail_and_follow_memory_are_bounded(runner: Runner, figure) -> None:  # type: ignore[no-untyped-def]
    handle = runner.run(AppDef("big", [py(BIG_LOG)]), "local")
    try:
        with serve_process() as (url, proc), httpx.Client(timeout=120, headers=auth(url)) as http:
            wait_for(lambda: listed(http, url, handle), what="app listed")
            wait_for(lambda: http.get(app_url(url, handle, "/logs"), params={"tail": 1}).json()["lines"] == ["last line"],
                     timeout=120, what="the whole log written")
            before = status_kib(proc.pid, "VmHWM")
            for _ in range(3):
                assert http.get(app_url(url, handle, "/logs"), params={"tail": 1}).json()["lines"] == ["last line"]
            grown = (status_kib(proc.pid, "VmHWM") - before) / 1024
            figure("server peak growth for tail=1 of 40 MB", grown, "MiB", limit=24)
            assert grown < 24

            # a follower that reads the first bytes and then nothing: the server queues a bounded amount
            with http.stream("GET", app_url(url, handle, "/logs/follow")) as resp:
                assert resp.status_code == 200
                chunks = resp.iter_bytes()
                next(chunks)
                time.sleep(8)
                stalled = (status_kib(proc.pid, "VmHWM") - before) / 1024
                figure("server peak growth with a stalled follower", stalled, "MiB", limit=64)
                assert stalled < 64
                text = b"".join(chunks).decode()
            assert "event: end" in text and "too slowly" in text
    finally:
        runner.cancel(handle)


@pytest.mark.reliability(
    "closed follow streams of a quiet replica",
    expect="30 streams opened and closed: the server's threads and sockets come back to where they were",
    group=LOAD,
)
def test_closed_follow_streams_release_threads_and_sockets(runner: Runner, figure) -> None:  # type: ignore[no-untyped-def]
    handle = runner.run(AppDef("quiet", [py("import time\nprint('up', flush=True)\ntime.sleep(300)")]), "local")
    try:
        with serve_process() as (url, proc), httpx.Client(timeout=30, headers=auth(url)) as http:
            wait_for(lambda: listed(http, url, handle), what="app listed")
            with http.stream("GET", app_url(url, handle, "/logs/follow")) as resp:
                next(resp.iter_lines())  # warm: the follower machinery has started once
            time.sleep(1)
            base_threads, base_socks = threads(proc.pid), unix_sockets(proc.pid)
            for _ in range(30):
                with http.stream("GET", app_url(url, handle, "/logs/follow")) as resp:
                    assert json.loads(next(ln for ln in resp.iter_lines() if ln.startswith("data: "))[6:]) == "up"
            wait_for(lambda: threads(proc.pid) <= base_threads + 2 and unix_sockets(proc.pid) <= base_socks + 2,
                     timeout=30, what=f"threads back to {base_threads} and sockets to {base_socks}")
            figure("threads left after 30 closed streams", max(0, threads(proc.pid) - base_threads), "")
    finally:
        runner.cancel(handle)


@pytest.mark.reliability(
    "tsm serve with the store write-locked",
    expect="one error line and exit status 1 (no URL, no traceback)",
    group=FAULTS,
)
def test_locked_store_is_one_line(tsm_home: Path) -> None:
    pytest.importorskip("starlette")
    with get_runner() as r:  # make the store exist
        r.list("local")
    db = sqlite3.connect(tsm_home / "tsm.db", timeout=1, isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    try:
        out = subprocess.run([sys.executable, "-m", "tsm.cli.main", "serve", "--port", "0"], capture_output=True,
                             text=True, timeout=HANG, env={**os.environ, "TSM_STORE_TIMEOUT": "1"})
    finally:
        db.execute("ROLLBACK")
        db.close()
    assert out.returncode == 1 and out.stdout == "", (out.stdout, out.stderr)
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "lock" in out.stderr


@pytest.mark.reliability(
    "clickjacking: the page with Cancel buttons in a frame",
    expect="every answer (page, API, 401) sends X-Frame-Options: DENY and a CSP with frame-ancestors 'none'",
    group=SECURITY,
)
def test_no_framing_and_a_strict_csp() -> None:
    with tsm_serve() as url, httpx.Client(timeout=30) as http:
        answers = [http.get(base(url) + "api/apps"), http.get(url), http.get(base(url) + "api/apps", headers=auth(url)),
                   http.get(base(url) + "static/app.js", headers=auth(url))]
        assert [a.status_code for a in answers] == [401, 200, 200, 200]
        for a in answers:
            assert a.headers["x-frame-options"] == "DENY"
            csp = a.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp and "script-src 'self'" in csp
            assert "unsafe-inline" not in csp and a.headers["referrer-policy"] == "no-referrer"

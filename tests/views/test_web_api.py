"""``tsm serve``'s JSON API and event streams, against a real server process and real local apps."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, Resource, Role

from .serving import auth, base, tsm_serve, wait_for

httpx = pytest.importorskip("httpx")


def py(code: str, name: str = "r", replicas: int = 1) -> Role:
    return Role(name, image=".", entrypoint=sys.executable, args=["-u", "-c", code], num_replicas=replicas,
                resource=Resource(cpu=1, gpu=0, memMB=128))


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner() as r:
        yield r


def app_url(url: str, handle: str, suffix: str = "") -> str:
    return base(url) + "api/apps/" + quote(handle, safe="") + suffix


def test_api_apps_logs_follow_samples_and_cancel(runner: Runner) -> None:
    code = ("import time\nfor i in range(1000):\n    print(f'tick {i}', flush=True)\n    t=time.time()\n"
            "    while time.time()-t<0.2: pass")
    handle = runner.run(AppDef("ticker", [py(code, "w", replicas=2)]), "local")
    try:
        with tsm_serve() as url, httpx.Client(timeout=30, headers=auth(url)) as http:
            def listed() -> Any:
                apps = http.get(base(url) + "api/apps").json()["apps"]
                return next((a for a in apps if a["handle"] == handle and a["state"] == "RUNNING"), None)

            app = wait_for(listed, what="app listed as RUNNING")
            assert app["name"] == "ticker" and [r["role"] for r in app["replicas"]] == ["w", "w"]
            one = http.get(app_url(url, handle)).json()
            assert one["handle"] == handle and one["replicas"][1]["idx"] == 1
            assert http.get(app_url(url, "local://default/nope")).status_code == 404
            assert http.get(app_url(url, handle, "/logs?k=x")).status_code == 400

            wait_for(lambda: len(http.get(app_url(url, handle, "/logs?k=1")).json()["lines"]) >= 3, what="3 lines")
            got = http.get(app_url(url, handle, "/logs?role=w&k=1&regex=tick 1$")).json()
            assert got["lines"] == ["tick 1"]

            seen: list[str] = []
            with http.stream("GET", app_url(url, handle, "/logs/follow?role=w&k=0")) as resp:
                assert resp.headers["content-type"].startswith("text/event-stream")
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        seen.append(json.loads(line[6:]))
                    if len(seen) >= 8:
                        break
            assert seen[:3] == ["tick 0", "tick 1", "tick 2"]

            samples = wait_for(lambda: (s := http.get(app_url(url, handle, "/samples")).json())
                               and all(len(s.get(k, [])) >= 2 for k in ("w/0", "w/1")) and s, what="samples")
            t, cpu, mem, gpu = samples["w/0"][-1]
            assert t > 0 and cpu is not None and cpu >= 0 and mem > 1 and gpu is None  # no NVIDIA GPU: n/a

            with http.stream("GET", base(url) + "api/events") as resp:
                first = next(json.loads(ln[6:]) for ln in resp.iter_lines() if ln.startswith("data: "))
            assert any(a["handle"] == handle for a in first["apps"])
            assert first["calls"]["store"] == 1 and first["calls"]["local.view_snapshot"] == 1  # one batched call each

            assert http.post(app_url(url, handle, "/cancel")).status_code == 403  # no X-TSM header
            assert runner.status(handle).state.name == "RUNNING"
            resp = http.post(app_url(url, handle, "/cancel"), headers={"X-TSM": "1"})
            assert resp.status_code == 200 and resp.json()["state"] == "CANCELLED"
            wait_for(lambda: http.get(app_url(url, handle)).json()["state"] == "CANCELLED", what="CANCELLED")
            # a finished app still has its curves
            assert len(http.get(app_url(url, handle, "/samples")).json()["w/0"]) >= 2
    finally:
        runner.cancel(handle)


def test_token_is_required_when_set() -> None:
    with tsm_serve("--token", "s3cret") as url, httpx.Client(timeout=30) as http:
        assert url.endswith("?token=s3cret")
        root = base(url)
        for path in ("", "api/apps", "api/events", "static/app.js"):
            assert http.get(root + path).status_code == 401
        assert http.get(root + "api/apps?token=wrong").status_code == 401
        assert http.get(root + "api/apps", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert http.get(root + "api/apps", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        page = http.get(url)
        assert page.status_code == 200 and "tsm_token" in page.headers["set-cookie"]
        assert "samesite=strict" in page.headers["set-cookie"].lower()
        assert http.get(root + "api/apps").status_code == 200  # the cookie the page got


def test_bound_elsewhere_a_token_is_made_up() -> None:
    with tsm_serve("--host", "0.0.0.0") as url, httpx.Client(timeout=30) as http:
        assert "?token=" in url and len(url.split("?token=")[1]) >= 24
        local = base(url).replace("0.0.0.0", "127.0.0.1")
        assert http.get(local + "api/apps").status_code == 401
        assert http.get(local + "api/apps?" + url.split("?")[1]).status_code == 200


@pytest.mark.parametrize("flags,expect", [
    (["--port", "70000"], "--port must be 0..65535"),
    (["--interval", "0"], "--interval must be between"),
    (["--host", "no.such.host.invalid"], "cannot listen on no.such.host.invalid"),
])
def test_bad_flags_are_one_line_errors(flags: list[str], expect: str) -> None:
    out = subprocess.run([sys.executable, "-m", "tsm.cli.main", "serve", *flags], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode in (1, 2) and expect in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_import_tsm_and_help_load_no_view_library() -> None:
    code = ("import sys, tsm\nfrom tsm.cli import main\nmain.build_parser()\n"
            "print(sorted(m for m in ('starlette', 'uvicorn', 'psutil', 'textual') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"

"""A launch whose MLflow tracking server does not answer fails after a bounded number of tries (the real
``mlflow`` client against a loopback server that answers 503 to everything), and the user's own limit wins."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tsm.components.utils import sh
from tsm.errors import TrackerError
from tsm.runner.api import get_runner


@pytest.fixture
def unavailable() -> Iterator[tuple[str, list[str]]]:
    """A tracking server that is always unavailable: its URL and the requests it got."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _no(self) -> None:
            seen.append(self.path)
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _no  # noqa: N815 - http.server's names

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


@pytest.mark.parametrize(("own", "tries"), [(None, 3), ("0", 1)])
def test_an_unavailable_server_fails_the_launch_after_a_few_tries(
    unavailable: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch, own: str | None, tries: int
) -> None:
    pytest.importorskip("mlflow")
    uri, seen = unavailable
    monkeypatch.setenv("TSM_TRACKERS", "mlflow")
    monkeypatch.setenv("TSM_TRACKER_MLFLOW_CONFIG", uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")  # the tries are counted, not waited for
    if own is None:
        monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", own)
    with get_runner() as r, pytest.raises(TrackerError, match="cannot create the app's run"):
        r.dryrun(sh("true"), "local")
    assert len(seen) == tries, seen
    assert os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES") == own  # the limit was the launch's only

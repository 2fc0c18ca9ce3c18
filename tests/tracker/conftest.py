"""Fixtures of the tracker tests: a real MLflow tracking server on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

#: How long the server may take to answer its health check on a loaded machine (a limit, not a wait).
START_LIMIT = 300.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``mlflow server`` on a free loopback port, up once its ``/health`` answers; stopped after."""
    pytest.importorskip("mlflow")  # tsm[mlflow]: `make test` installs it (the $(VENV)/.trackers stamp)
    work = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    log = open(work / "server.log", "wb")  # noqa: SIM115 - closed below, after the server
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{work}/mlflow.db",
         "--default-artifact-root", str(work / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work, start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_LIMIT
        while True:
            assert server.poll() is None, (work / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"mlflow server never answered: {(work / 'server.log').read_text()[-3000:]}"
            time.sleep(0.2)
        yield uri
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)
        log.close()

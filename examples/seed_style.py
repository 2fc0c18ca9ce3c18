"""A multi-role app in the seed TSM style: two trainers, a parameter server and a reader, run locally.

Run it with ``python examples/seed_style.py`` (``make demo``). It launches the app on the local
scheduler, prints every replica's log lines as they come (prefixed ``role/k``), waits for the app to
end, prints its final status and exits 0 if it SUCCEEDED. The replicas are the plain Python scripts in
``examples/app/``; no torch is needed.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import tsm

APP_DIR = Path(__file__).resolve().parent / "app"


def build_app() -> tsm.AppDef:
    """The app: each role runs a script of ``examples/app`` in that directory (the local "image").

    Entrypoints are named relative to the image, as the seed TSM API wrote them; the scripts are not
    executable, so the local scheduler runs each with the interpreter running this program.
    """
    small = tsm.Container(image=str(APP_DIR)).require(tsm.Resource(cpu=1, gpu=0, memMB=256))
    server = tsm.Container(image=str(APP_DIR)).require(tsm.Resource(cpu=1, gpu=0, memMB=512)).ports(rpc=0)

    trainer = tsm.Role("trainer").runs("trainer.py", "--epochs", "3").on(small).replicas(2)
    ps = tsm.Role("ps").runs("ps.py", NUM_SHARDS="2").on(server).replicas(1)
    reader = tsm.Role("reader").runs("reader.py", "file:///data/train").on(small).replicas(1)
    return tsm.Application("seed_demo").of(trainer, ps, reader)


def stream(handle: str, role: str, k: int, lock: threading.Lock) -> None:
    """Print one replica's lines as they are written, until it ends (a session per thread)."""
    with tsm.session("seed_demo") as session:
        for line in session.log_lines(handle, role, k, should_tail=True):
            with lock:
                print(f"{role}/{k} {line}", end="" if line.endswith("\n") else "\n", flush=True)


def main() -> int:
    app = build_app()
    cfg = tsm.RunConfig()
    cfg.set("grace_period", 5.0)  # seconds between SIGTERM and SIGKILL if the app is stopped
    with tsm.session("seed_demo") as session:
        handle = session.run(app, scheduler="local", cfg=cfg)
        print(f"launched {handle}", flush=True)
        lock = threading.Lock()
        readers = [
            threading.Thread(target=stream, args=(handle, role.name, k, lock))
            for role in app.roles
            for k in range(role.num_replicas)
        ]
        for t in readers:
            t.start()
        status = session.wait(handle)
        for t in readers:
            t.join()
        print(status.format(), flush=True)
    return 0 if status.state == tsm.AppState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())

"""Security of the local scheduler: private state, no network listeners, no privileges beyond the caller's.

Each case is a row of the README's Reliability table (``make harden``). The checks look at the real files and
the real processes (``/proc``), with a positive control wherever a check could otherwise pass vacuously.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from testutil import HANG, procs_with, py, sleep_marker, wait_until
from tsm.schedulers.api import Stream
from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs import AppDef, AppState, Role

PY = sys.executable
SECURITY = "Security"
NOBODY = 65534




def owners(sched: LocalScheduler, app_id: str) -> list[int]:
    row = sched.store.query("SELECT sup_pid, watchdog_pid FROM local_apps WHERE app_id=?", (app_id,))[0]
    return [row["sup_pid"], row["watchdog_pid"]]


def ready(sched: LocalScheduler, app_id: str, role: str = "r") -> str:
    """Wait for the replica's first stdout line (it prints once it is set up) and return it."""
    lines: list[str] = []

    def got() -> bool:
        lines[:] = list(sched.log_iter(app_id, role, 0, streams=Stream.STDOUT))
        return bool(lines)

    wait_until(got, "the replica's first line", timeout=HANG)
    return lines[0]


# -- private state ------------------------------------------------------------------------------------
def sockets_in(paths: list[Path]) -> list[Path]:
    """The sockets among ``paths``; one removed since it was listed is not one (a launcher starting beside the
    first supervisor binds ``<key>.<pid>.tmp`` and renames it while a test walks the home)."""
    found = []
    for p in paths:
        try:
            if stat.S_ISSOCK(p.lstat().st_mode):
                found.append(p)
        except FileNotFoundError:
            continue
    return found


def loose_modes(root: Path) -> list[str]:
    """Everything under ``root`` (itself included) that group or others may read, write or enter."""
    found = []
    for p in [root, *root.rglob("*")]:
        try:
            mode = p.lstat().st_mode
        except FileNotFoundError:  # removed meanwhile (the supervisor unlinks its socket as it exits)
            continue
        if not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & 0o077:
            found.append(f"{p} {stat.filemode(mode)}")
    return found


LAUNCH_UMASK_0 = """
    import os, sys
    os.umask(0)
    from tsm.runner.api import get_runner
    from tsm.specs import AppDef, Role
    code = "import os, time; print('secret', flush=True); os.write(2, b'err\\\\n'); time.sleep(300)"
    role = Role("r", entrypoint=sys.executable, args=["-c", code])
    print(get_runner().run(AppDef("private", [role]), cfg={"log_dir": sys.argv[1]} if sys.argv[1] else None))
"""


@pytest.mark.reliability(
    "state and logs are private, even when the caller's umask is 0",
    expect="$TSM_HOME and every folder 0700; store, WAL, logs, indexes, sockets 0600 (also under a log_dir)",
    group=SECURITY,
)
@pytest.mark.parametrize("where", ["home", "log_dir"])
def test_state_and_logs_are_private_under_umask_0(where: str, tsm_home: Path, tmp_path: Path, figure) -> None:  # type: ignore[no-untyped-def]
    log_root = tmp_path / "logs" if where == "log_dir" else None
    out = subprocess.run([PY, "-c", textwrap.dedent(LAUNCH_UMASK_0), str(log_root or "")], capture_output=True,
                         text=True, timeout=HANG, check=True)
    handle = out.stdout.strip()
    app_id = handle.rsplit("/", 1)[1]
    sched = LocalScheduler("check")
    assert ready(sched, app_id) == "secret\n"
    roots = [tsm_home] + ([log_root] if log_root else [])
    files = [p for r in roots for p in r.rglob("*")]
    sockets = sockets_in(files)
    assert len(sockets) >= 2, "the supervisor's and the timer server's sockets should exist while the app runs"
    assert any(p.name.endswith("-wal") for p in files)
    assert any("stderr" in p.name for p in files)
    running = [m for r in roots for m in loose_modes(r)]
    sched.cancel(app_id)
    ended = [m for r in roots for m in loose_modes(r)]
    sched.close()
    assert running == [] and ended == []
    figure("paths checked", len(files) + len(roots), "")


@pytest.mark.reliability(
    "another user cannot reach an app",
    expect="a process running as nobody cannot open the store, read logs or connect to the supervisor's or timer sockets",
    group=SECURITY,
)
def test_another_user_cannot_reach_the_app(sched: LocalScheduler, tsm_home: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to another user")
    app_id = sched.submit(AppDef("mine", [py("import time; print('up', flush=True); time.sleep(300)")]), {})
    ready(sched, app_id)
    sockets = [str(p) for p in sockets_in(list(tsm_home.rglob("*")))]
    logs = [str(p) for p in tsm_home.rglob("stdout")]
    assert sockets and logs
    probe = textwrap.dedent("""
        import json, os, socket, sys
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
        paths = json.loads(sys.argv[1])
        results = {}
        for p in paths["files"]:
            try:
                open(p, "rb").read(1); results[p] = "read"
            except OSError as e:
                results[p] = type(e).__name__
        for p in paths["sockets"]:
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(p); results[p] = "connected"
            except OSError as e:
                results[p] = type(e).__name__
        print(json.dumps(results))
    """)
    import json

    targets = {"files": [str(tsm_home / "tsm.db"), *logs], "sockets": sockets}
    out = subprocess.run([PY, "-S", "-c", probe, json.dumps(targets)], capture_output=True, text=True,
                         timeout=HANG, check=True)
    results = json.loads(out.stdout)
    assert results and set(results.values()) == {"PermissionError"}, results
    sched.cancel(app_id)


# -- no network -----------------------------------------------------------------------------------------
def inet_sockets(pids: list[int]) -> list[str]:
    """The IPv4/IPv6 TCP, UDP and raw sockets the given processes hold, as ``proto local-address state``."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # the process ended
        for fd in fds:
            try:
                with_target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed since the listing: the others are still looked at
            if with_target.startswith("socket:["):
                inodes[with_target[8:-1]] = pid
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6", "raw", "raw6"):
        try:
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[9] in inodes:
                found.append(f"{proto} {cols[1]} st={cols[3]} pid={inodes[cols[9]]}")
    return found


@pytest.mark.reliability(
    "nothing listens on a network port unless the app asked for one",
    expect="supervisor, watchdog and a plain replica hold no TCP/UDP/raw socket; a replica given a port_map can",
    group=SECURITY,
)
def test_no_network_sockets_unless_the_app_asks(sched: LocalScheduler, figure) -> None:  # type: ignore[no-untyped-def]
    marker = sleep_marker()
    plain = Role("plain", entrypoint="sleep", args=[marker])
    listener = py(
        """
        import os, socket, time
        s = socket.socket(); s.bind(("127.0.0.1", int(os.environ["TSM_PORT_HTTP"]))); s.listen()
        print("listening", flush=True); time.sleep(300)
        """,
        "server",
        port_map={"http": 0},
    )
    app_id = sched.submit(AppDef("net", [plain, listener]), {})
    ready(sched, app_id, "server")
    ours = owners(sched, app_id)
    wait_until(lambda: bool(procs_with(marker)), "the plain replica")
    plain_pids = procs_with(marker)
    assert inet_sockets(ours + plain_pids) == []
    desc = sched.describe(app_id)
    assert desc is not None
    server_pid = next(r.pid for rs in desc.roles_statuses if rs.role == "server" for r in rs.replicas)
    assert server_pid is not None
    held = inet_sockets([server_pid])  # positive control: the same check sees a socket the app asked for
    assert len(held) == 1 and held[0].startswith("tcp "), held
    sched.cancel(app_id)
    figure("network sockets held by tsm's processes", len(inet_sockets(ours + plain_pids)), "", limit=0)


# -- privileges ---------------------------------------------------------------------------------------
def credentials(pid: int) -> dict[str, str]:
    """The identity and capability lines of ``/proc/<pid>/status``."""
    keep = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (ln.partition(":") for ln in lines) if k in keep}


SUBMIT_AS = """
    import os, sys
    os.setgroups([]); os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))
    from tsm.schedulers.local.scheduler import LocalScheduler
    from tsm.specs import AppDef, Role
    app = AppDef("unpriv", [Role("r", entrypoint="sh", args=["-c", 'id -u; touch "$0" || echo refused', sys.argv[2]])])
    s = LocalScheduler("u")
    app_id = s.submit(app, {})
    print(app_id, s.wait(app_id, timeout=120).state.name, flush=True)
"""


PROBE_AS = """
    import os, sys
    os.setgroups([]); os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))
    import json, sqlite3, subprocess, tsm.schedulers.local.scheduler
    subprocess.run([sys.executable, "-S", "-c", "import json, selectors, sqlite3"], check=True)
"""


def python_for(uid: int, base: Path) -> tuple[str, dict[str, str]]:
    """An interpreter (and environment) with which ``uid`` can run tsm and its supervisor.

    This one, when ``uid`` can read it and tsm. Otherwise (a root-only pyenv under ``/root``, a clone in a
    private folder) a private copy under ``base``: the interpreter, its shared library, the standard
    library without tests and caches, and the tsm package, all readable by everyone. Skips only when even
    that copy cannot run as ``uid``, saying why.
    """
    import sysconfig

    import tsm

    src = str(Path(tsm.__file__).resolve().parents[1])
    env = {"PYTHONPATH": src}
    probe = [textwrap.dedent(PROBE_AS), str(uid)]
    if subprocess.run([PY, "-c", *probe], env={**os.environ, **env}, capture_output=True, timeout=HANG).returncode == 0:
        return PY, env
    prefix = Path(sys.base_prefix)
    runtime = base / "python"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    junk = shutil.ignore_patterns("__pycache__", "site-packages", "test", "tests", "idlelib", "tkinter",
                                  "turtledemo", "ensurepip", "lib2to3", "*.pyc")
    (runtime / "bin").mkdir(parents=True)
    real = Path(os.path.realpath(sys.executable))
    shutil.copy2(real, runtime / "bin" / version)
    shutil.copytree(prefix / "lib" / version, runtime / "lib" / version, ignore=junk)
    libdir = sysconfig.get_config_var("LIBDIR") or str(prefix / "lib")
    for lib in Path(libdir).glob("libpython*.so*"):
        shutil.copy2(lib, runtime / "lib" / lib.name)
    shutil.copytree(Path(src) / "tsm", runtime / "pkg" / "tsm", ignore=junk)
    for root, dirs, files in os.walk(base / "python"):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o755 if root.endswith("bin") else 0o644)
    python = str(runtime / "bin" / version)
    env = {"PYTHONPATH": str(runtime / "pkg"), "LD_LIBRARY_PATH": str(runtime / "lib"), "PYTHONHOME": str(runtime)}
    check = subprocess.run([python, "-c", *probe], env={**os.environ, **env}, capture_output=True, text=True,
                           timeout=HANG)
    if check.returncode != 0:
        pytest.skip(f"no interpreter that uid {uid} can run tsm with could be made: {check.stderr.strip()[-300:]}")
    return python, env


@pytest.mark.reliability(
    "the supervisor runs with the caller's privileges only",
    expect="supervisor and watchdog have the caller's uid, gids and capabilities; launched as nobody, replicas are nobody",
    group=SECURITY,
)
def test_supervisor_has_the_callers_privileges_only(sched: LocalScheduler, request: pytest.FixtureRequest) -> None:
    app_id = sched.submit(AppDef("creds", [py("import time; print('up', flush=True); time.sleep(300)")]), {})
    ready(sched, app_id)
    mine = credentials(os.getpid())
    for pid in owners(sched, app_id):
        assert credentials(pid) == mine
        assert os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    sched.cancel(app_id)
    if os.geteuid() != 0:
        return
    # Launched by an unprivileged user: everything runs as that user, who cannot write where root can.
    # (pytest's tmp folders are root-only, so this one is made where nobody can reach it.)
    base = Path(tempfile.mkdtemp(prefix="tsm-nobody-"))
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    os.chmod(base, 0o755)
    home = base / "home"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY, NOBODY)
    forbidden = base / "root-only"
    forbidden.mkdir(mode=0o755)
    python, runtime_env = python_for(NOBODY, base)
    env = {**os.environ, **runtime_env, "TSM_HOME": str(home), "HOME": str(home)}
    out = subprocess.run([python, "-c", textwrap.dedent(SUBMIT_AS), str(NOBODY), str(forbidden / "x")],
                         capture_output=True, text=True, env=env, timeout=HANG, cwd=str(home))
    assert out.returncode == 0, out.stderr[-2000:]
    other_id, state = out.stdout.split()
    assert state == "SUCCEEDED"
    log = (home / "local" / other_id / "logs" / "r" / "0" / "stdout").read_text()
    assert log.splitlines() == [str(NOBODY), "refused"]
    assert not (forbidden / "x").exists()
    assert {p.stat().st_uid for p in [home, *home.rglob("*")]} == {NOBODY}


# -- timers -------------------------------------------------------------------------------------------
REPLICA_ARMS_A_TIMER_FOR = """
    import os, sys, time
    from tsm.errors import TimerError
    from tsm.timer import SocketTimerClient, TimerRequest
    client = SocketTimerClient(os.environ["TSM_TIMER_SOCKET"])
    for victim in [*map(int, sys.argv[1:]), os.getppid()]:  # the parent is the app's own supervisor
        try:
            client.send_request(TimerRequest(victim, "evil", time.time() + 0.05))
            print("accepted", flush=True)
        except TimerError as e:
            print("refused", flush=True)
    client.send_request(TimerRequest(None, "mine", time.time() + 600))  # positive control: its own pid is fine
    print("own timer accepted", flush=True)
    time.sleep(0.5)
"""


@pytest.mark.reliability(
    "a replica cannot make its app's timer server signal another process",
    expect="requests naming a bystander, pid 1, the caller or the supervisor are refused (peer credentials); all live",
    group=SECURITY,
)
def test_replica_cannot_aim_the_timer_server_at_another_process(sched: LocalScheduler) -> None:
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        victims = [bystander.pid, 1, os.getpid()]
        role = Role("r", entrypoint=PY, args=["-c", textwrap.dedent(REPLICA_ARMS_A_TIMER_FOR), *map(str, victims)])
        app_id = sched.submit(AppDef("evil", [role]), {})
        desc = sched.wait(app_id, timeout=HANG)
        assert desc is not None and desc.state == AppState.SUCCEEDED, desc
        lines = list(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT))
        assert lines == ["refused\n"] * 4 + ["own timer accepted\n"]
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


# -- what a replica says reaches the terminal escaped ---------------------------------------------------------
@pytest.mark.reliability(
    "text a replica chose never acts on the terminal of tsm status",
    expect="a replica reaped by an expiration timer it named with ESC/BEL/CR sequences: tsm status and tsm wait "
    "print the reason with those written as escapes",
    group=SECURITY,
)
def test_a_replicas_words_in_tsm_status_are_escaped(tmp_path: Path) -> None:
    code = ("import time\nfrom tsm.timer import expires\n"
            "with expires(after=0.2, scope='\\x1b[2J\\x1b]0;owned\\x07\\rscope'):\n    time.sleep(60)\n")
    tsm = [PY, "-m", "tsm.cli.main"]
    r = subprocess.run([*tsm, "run", "--detach", "utils.python", "-c", code], capture_output=True, text=True,
                       timeout=HANG)
    assert r.returncode == 0, r
    handle = r.stdout.split()[-1]
    for verb in ("wait", "status"):
        shown = subprocess.run([*tsm, verb, handle], capture_output=True, text=True, timeout=HANG).stdout
        assert "expired timer" in shown and "\\x1b[2J" in shown, shown
        assert not any(c in shown for c in "\x1b\x07\r"), repr(shown)

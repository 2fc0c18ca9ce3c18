"""The per-user launcher (``launcher.py``): supervisors forked from it, and every way it can fail or be stale.

What must hold: an app started through the launcher behaves as a spawned one; a launcher that is dead
(SIGKILL at any point), stopped, not this user's or from older code is never in the way (the caller spawns
the supervisor itself, and the app runs exactly once); apps forked by a launcher outlive it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testutil import HANG, wait_until
from tsm.schedulers.local import _os, launcher
from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs import AppDef, AppState, Role
from tsm.store import tsm_home
from tsm.util import daemon


def key() -> str:
    return launcher.launcher_key()


def sock_path() -> Path:
    return Path(launcher.launcher_dir(str(tsm_home())), key() + ".sock")


def launcher_pid() -> int:
    """The pid of this home's launcher, once it listens (asked from the socket itself)."""
    found: list[int] = []

    def listening() -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(sock_path()))
            except OSError:  # not there yet, or the stale socket of a killed one
                return False
            found.append(launcher._CRED.unpack(s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0])
        return True

    wait_until(listening, "the launcher's socket", timeout=HANG)
    return found[0]


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return int(data[data.rindex(b")") + 2 :].split()[1])


def watchdog(sched: LocalScheduler, app_id: str) -> int:
    wait_until(lambda: sched.app_row(app_id)["watchdog_pid"] is not None, "the supervisor's registration")
    return int(sched.app_row(app_id)["watchdog_pid"])


def counting_app(tmp_path: Path, name: str, seconds: float = 0.0) -> AppDef:
    """One replica that appends a line to ``tmp_path/name`` per run (so a test can count runs), then sleeps."""
    code = f"import time\nopen({str(tmp_path / name)!r}, 'a').write('ran\\n')\ntime.sleep({seconds})"
    return AppDef(name, [Role("r", entrypoint=sys.executable, args=["-c", code])])


@pytest.fixture
def warm(sched: LocalScheduler, tmp_path: Path) -> Iterator[int]:
    """A launcher up for this home (started beside the first, spawned, supervisor); its pid."""
    first = sched.submit(counting_app(tmp_path, "first"), {})
    assert sched.wait(first, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    pid = launcher_pid()
    yield pid
    if _os.start_time(pid) is not None:
        os.kill(pid, signal.SIGKILL)


def test_first_app_starts_a_launcher_and_the_next_is_forked_by_it(sched: LocalScheduler, tmp_path: Path,
                                                                    warm: int) -> None:
    app_id = sched.submit(counting_app(tmp_path, "second", 30), {})
    assert parent_of(watchdog(sched, app_id)) == warm  # forked, not spawned by this process
    def named() -> bool:  # ps names the app, as for a spawned one (the watchdog learns it beside the
        with open(f"/proc/{watchdog(sched, app_id)}/cmdline", "rb") as f:  # registration, not before it)
            return sched.app_row(app_id)["app_dir"].encode() in f.read()

    wait_until(named, "the watchdog's command line naming the app", timeout=HANG)
    mode = os.stat(launcher.launcher_dir(str(tsm_home()))).st_mode & 0o777
    assert mode == 0o700 and os.stat(sock_path()).st_uid == os.getuid()
    wait_until((tmp_path / "second").exists, "the replica's run", timeout=HANG)
    sched.cancel(app_id)
    assert sched.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]
    assert (tmp_path / "second").read_text() == "ran\n"


def test_apps_outlive_a_launcher_killed_with_sigkill(sched: LocalScheduler, tmp_path: Path, warm: int) -> None:
    app_id = sched.submit(counting_app(tmp_path, "long", 2), {})
    assert parent_of(watchdog(sched, app_id)) == warm
    os.kill(warm, signal.SIGKILL)
    desc = sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    # with the launcher dead the next app is spawned (and starts a new launcher beside itself)
    again = sched.submit(counting_app(tmp_path, "again"), {})
    assert sched.wait(again, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert launcher_pid() != warm


def test_a_launcher_that_dies_after_taking_the_request_is_not_in_the_way(sched: LocalScheduler,
                                                                          tmp_path: Path) -> None:
    """A 'launcher' that accepts, reads the request and dies without answering (SIGKILL before its fork)."""
    if not launcher.enabled():
        pytest.skip("launchers are disabled here")
    os.makedirs(sock_path().parent, mode=0o700, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path()))
    listener.listen(8)
    code = (
        "import socket, sys\n"
        "l = socket.socket(fileno=int(sys.argv[1]))\n"
        "c, _ = l.accept(); socket.recv_fds(c, 8192, 1)\n"
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    dying = subprocess.Popen([sys.executable, "-c", code, str(listener.fileno())], pass_fds=(listener.fileno(),))
    listener.close()
    try:
        app_id = sched.submit(counting_app(tmp_path, "fallback"), {})
        assert sched.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
        assert dying.wait(timeout=HANG) == -signal.SIGKILL
        assert (tmp_path / "fallback").read_text() == "ran\n"
    finally:
        dying.kill()
        dying.wait()


def standby_of(pid: int) -> list[int]:
    """The launcher's standbys: each one's watchdog (the launcher's child) and the supervisor under it."""
    return [c for w in _os.children(pid) for c in (w, *_os.children(w))]


def test_a_stopped_launcher_is_bypassed_and_starts_nothing_when_it_resumes(sched: LocalScheduler,
                                                                           tmp_path: Path, warm: int) -> None:
    wait_until(lambda: len(standby_of(warm)) == 2 * launcher.POOL, "the launcher's standbys", timeout=HANG)
    stopped = [warm, *standby_of(warm)]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        app_id = sched.submit(counting_app(tmp_path, "once", 1), {})  # waits ACK_TIMEOUT, then spawns
        assert parent_of(watchdog(sched, app_id)) != warm
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    desc = sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    time.sleep(0.5)  # room for a wrong second supervisor to run the replica again (none must)
    assert (tmp_path / "once").read_text() == "ran\n"
    assert sorted(standby_of(warm)) == sorted(stopped[1:]), "a resumed standby took the abandoned request"


def test_another_user_cannot_make_it_fork(sched: LocalScheduler, tmp_path: Path, warm: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    home = tsm_home()
    wait_until(lambda: len(standby_of(warm)) == 2 * launcher.POOL, "the launcher's standbys", timeout=HANG)
    before = standby_of(warm)
    os.chmod(sock_path().parent, 0o755)  # open the way on purpose: the credential check alone must refuse
    os.chmod(sock_path(), 0o777)
    code = (
        "import os, socket, sys\n"
        "d = os.open(os.path.dirname(sys.argv[1]), os.O_PATH)\n"  # reached as root, used as nobody
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(10)\n"
        "s.connect(f'/proc/self/fd/{d}/' + os.path.basename(sys.argv[1]))\n"
        "r, w = os.pipe()\n"
        "try:\n"
        "    socket.send_fds(s, [b'1024 1024 ' + sys.argv[2].encode()], [w])\n"
        "    print(repr(s.recv(1)))\n"
        "except (BrokenPipeError, ConnectionResetError):\n"
        "    print('reset')\n"
    )
    app_dir = os.path.join(home, "local", "intruder-00000000")
    out = subprocess.run([sys.executable, "-c", code, str(sock_path()), app_dir], capture_output=True, text=True,
                         timeout=HANG)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("b''", "reset"), out.stdout  # closed without an answer
    assert not os.path.exists(app_dir)  # nothing was started for it
    assert sorted(standby_of(warm)) == sorted(before), "the standby took another user's request"


def test_the_key_changes_with_the_code_and_the_interpreter(tmp_path: Path) -> None:
    pkg = tmp_path / "tsm"
    (pkg / "schedulers" / "local").mkdir(parents=True)
    src = pkg / "schedulers" / "local" / "supervisor.py"
    src.write_text("x = 1\n")
    before = launcher.launcher_key(str(tmp_path), "/usr/bin/python3")
    assert launcher.launcher_key(str(tmp_path), "/usr/bin/python3") == before
    assert launcher.launcher_key(str(tmp_path), "/opt/python3") != before
    os.utime(src, ns=(0, os.stat(src).st_mtime_ns + 1_000_000_000))  # an upgrade that keeps the size
    assert launcher.launcher_key(str(tmp_path), "/usr/bin/python3") != before


def test_a_launcher_of_older_code_is_never_asked_and_exits(tmp_path: Path) -> None:
    """A launcher started from a copy of tsm whose sources then change (an upgrade) stops serving."""
    copy = tmp_path / "src"
    shutil.copytree(Path(daemon.package_parent()) / "tsm", copy / "tsm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    old_key = launcher.launcher_key(str(copy))
    home = str(tsm_home())
    code = "import sys; sys.path.insert(0, sys.argv.pop(1)); from tsm.schedulers.local.launcher import main; main()"
    proc = subprocess.Popen([sys.executable, "-S", "-c", code, str(copy), home])
    try:
        old_sock = Path(launcher.launcher_dir(home), old_key + ".sock")
        wait_until(old_sock.exists, "the old launcher's socket", timeout=HANG)
        assert old_key != key()  # this tree's callers ask another socket: never the old launcher's
        target = copy / "tsm" / "schedulers" / "local" / "supervisor.py"
        target.write_text(target.read_text() + "\n# upgraded\n")
        assert proc.wait(timeout=HANG) == 0  # it noticed the change and exited
        assert not old_sock.exists()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to give the caller a narrower set")
def test_a_caller_with_other_process_settings_gets_them_not_the_launchers(sched: LocalScheduler, tmp_path: Path,
                                                                         warm: int) -> None:
    """A caller under ``taskset`` (or another cgroup, nice, rlimits, ...) is not served by a launcher started
    with other settings: its replicas run with the caller's CPU set, as if it had spawned its supervisor."""
    cpu = min(os.sched_getaffinity(0))
    out = tmp_path / "affinity"
    code = (
        "import os, sys\n"
        f"os.sched_setaffinity(0, {{{cpu}}})\n"
        "from tsm.schedulers.local.scheduler import LocalScheduler\n"
        "from tsm.specs import AppDef, Role\n"
        "s = LocalScheduler('t')\n"
        "probe = 'import os; open(%r, \"w\").write(str(sorted(os.sched_getaffinity(0))))' % sys.argv[1]\n"
        "app_id = s.submit(AppDef('aff', [Role('r', entrypoint=sys.executable, args=['-c', probe])]), {})\n"
        "print(s.wait(app_id, timeout=60).state.name)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=HANG)
    assert r.stdout.strip() == "SUCCEEDED", r
    assert out.read_text() == str([cpu])  # the launcher (all CPUs) would have given the replica its own set


def test_a_standbys_rehearsal_leaves_nothing_behind(sched: LocalScheduler, warm: int) -> None:
    """While it waits, each standby runs its request path once on nothing (``launcher._rehearse``): no app
    folder, socket, record or history row may come of it."""
    wait_until(lambda: len(standby_of(warm)) == 2 * launcher.POOL, "the launcher's standbys", timeout=HANG)
    home = tsm_home()
    ldir = Path(launcher.launcher_dir(str(home)))
    want = sorted(f"{key()}.{ext}" for ext in ("lock", "lock.start", "log", "sock"))
    # a launcher binds its socket under a name of its own (sock.<pid>) and renames it: wait for that to pass,
    # so only a file that stays fails the test
    wait_until(lambda: sorted(p.name for p in ldir.iterdir()) == want, "only the launcher's own files", timeout=HANG)
    assert not (home / "local" / ".rehearsal").exists()
    assert sched.store.query("SELECT app_id, state, sup_pid FROM local_apps WHERE app_id IN ('', '.rehearsal')") == []
    assert (ldir / f"{key()}.log").read_text() == ""  # nothing failed in it either


def test_a_request_that_never_comes_is_refused_and_the_next_caller_is_served(sched: LocalScheduler,
                                                                             tmp_path: Path, warm: int) -> None:
    """A caller connects (as ``schedule`` does before it writes the app) and never sends its request: the standby
    that took the connection gives up after the ack timeout and waits again; nothing is started, and the
    callers after it are served by standbys, not by spawning."""
    wait_until(lambda: len(standby_of(warm)) == 2 * launcher.POOL, "the launcher's standbys", timeout=HANG)
    apps_before = {p.name for p in (tsm_home() / "local").iterdir()}
    silent = launcher.connect(str(tsm_home()))
    assert silent is not None
    try:
        first = sched.submit(counting_app(tmp_path, "meanwhile"), {})  # the other standby takes it
        assert parent_of(watchdog(sched, first)) == warm
        time.sleep(launcher.ACK_TIMEOUT + 0.5)
        again = sched.submit(counting_app(tmp_path, "after"), {})
        assert parent_of(watchdog(sched, again)) == warm
    finally:
        silent.close()
    for app_id in (first, again):
        assert sched.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert {p.name for p in (tsm_home() / "local").iterdir()} - apps_before == {first, again}  # nothing else


#: A caller that changes its own settings, then runs one app whose replica reports what it got; both as JSON.
_CALLER = r'''
import ctypes, json, os, sys, time
libc = ctypes.CDLL("libc.so.6", use_errno=True)
IOPRIO = {"x86_64": (251, 252), "aarch64": (30, 31)}[os.uname().machine]

def mine():
    status = {ln.split(":")[0]: ln.split(":", 1)[1].split() for ln in open("/proc/self/status")}
    return {"umask": status["Umask"], "uid": status["Uid"], "gid": status["Gid"], "groups": status["Groups"],
            "ioprio": libc.syscall(IOPRIO[1], 1, 0), "personality": open("/proc/self/personality").read().strip(),
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "core": list(__import__("resource").getrlimit(__import__("resource").RLIMIT_CORE))}

if sys.argv[1] == "replica":
    sup = os.getppid()
    chain = [sup]
    for _ in range(2):
        with open(f"/proc/{chain[-1]}/stat") as f:
            chain.append(int(f.read().rsplit(")", 1)[1].split()[1]))
    json.dump({**mine(), "chain": chain}, open(sys.argv[2], "w"))
    sys.exit(0)
changes = json.loads(sys.argv[3])
if "umask" in changes:
    os.umask(changes["umask"])
if "gid" in changes:
    os.setgroups([changes["gid"]])
    os.setgid(changes["gid"])
if "ioprio" in changes:
    assert libc.syscall(IOPRIO[0], 1, 0, changes["ioprio"]) == 0
if "personality" in changes:
    libc.personality(libc.personality(0xFFFFFFFF) | changes["personality"])
if "nice" in changes:
    os.nice(changes["nice"])
if "core" in changes:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (changes["core"], resource.getrlimit(resource.RLIMIT_CORE)[1]))
from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs import AppDef, Role
s = LocalScheduler("t")
app_id = s.submit(AppDef("ctx", [Role("r", entrypoint=sys.executable, args=["-I", "-S", __file__, "replica", sys.argv[2]])]), {})
state = s.wait(app_id, timeout=60).state.name
print(json.dumps({"state": state, "caller": mine()}))
'''

_SETTINGS = {  # what a caller may run under, and how it is set
    "umask 022 (the launcher works under 077)": {"umask": 0o022},
    "umask 002": {"umask": 0o002},
    "ionice -c3 (idle I/O class)": {"ioprio": 3 << 13},
    "ionice -c2 -n7": {"ioprio": (2 << 13) | 7},
    "setarch -R (no address randomisation)": {"personality": 0x0040000},
    "nice 5": {"nice": 5},
    "ulimit -c 0": {"core": 0},
    "sg / newgrp (another primary group, no supplementary ones)": {"gid": 12345},
}


@pytest.mark.reliability(
    "a replica runs with the caller's credentials and settings however its supervisor started",
    expect="under umask 022/002, ionice -c3 / -c2 -n7, setarch -R, nice 5, ulimit -c 0 or another primary group, "
    "the replica's uid, gids, groups, umask, I/O priority, nice, limits and personality are the caller's",
    group="Security",
)
@pytest.mark.parametrize("started", ["forked by the launcher", "spawned"])
def test_a_replica_runs_with_the_callers_credentials_and_settings_however_its_supervisor_started(
        sched: LocalScheduler, tmp_path: Path, started: str, figure) -> None:  # type: ignore[no-untyped-def]
    """The caller's uid, gids, groups, umask, I/O priority, nice value, limits and personality are the replica's,
    whether a launcher (started by a caller with other settings) forked its supervisor or the caller spawned it."""
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("the probe knows ioprio's system call numbers on x86_64 and aarch64 only")
    launcher_at = None
    env = {**os.environ, "TSM_LAUNCHER": "0"}
    if started == "forked by the launcher":
        first = sched.submit(counting_app(tmp_path, "first"), {})  # starts a launcher with this process's settings
        assert sched.wait(first, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
        launcher_at = launcher_pid()
        env = {k: v for k, v in os.environ.items() if k != "TSM_LAUNCHER"}
    probe = tmp_path / "caller.py"
    probe.write_text(_CALLER)
    import json

    wrong, checked = [], 0
    for setting, changes in _SETTINGS.items():
        if "gid" in changes and os.geteuid() != 0:
            continue  # changing the primary group needs root
        out = tmp_path / "replica.json"
        r = subprocess.run([sys.executable, str(probe), "caller", str(out), json.dumps(changes)], capture_output=True,
                           text=True, timeout=HANG, env=env)
        assert r.returncode == 0, r.stderr
        result = json.loads(r.stdout)
        assert result["state"] == "SUCCEEDED", r
        replica = json.loads(out.read_text())
        chain = replica.pop("chain")
        checked += 1
        if replica != result["caller"]:  # every setting, not only the one changed
            wrong.append(f"{setting}: replica {replica} != caller {result['caller']}")
        if launcher_at is not None and "umask" in changes and chain[2] != launcher_at:
            wrong.append(f"{setting}: the launcher did not serve a caller that differs only in its umask")
    assert wrong == [], "\n".join(wrong)
    figure("settings checked", checked, "")

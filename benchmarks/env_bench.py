"""Lockfile environments: cold build against uv by hand, warm start of a replica, concurrent launches; JSON out.

    python benchmarks/env_bench.py            # 40 packages, 5 runs each
    python benchmarks/env_bench.py --tiny     # 5 packages, 2 runs (a smoke run, not a measurement)

Offline from a wheelhouse the script writes itself (``--packages`` pure-Python wheels of ``--files`` modules
each), locked with ``uv lock --offline``. Measured, each beside its baseline:

* ``env_cold_build``  ``EnvCache.ensure`` of the lock into an empty cache (uv's own cache emptied too), against
  the same lock installed by hand: ``uv export`` + ``uv venv`` + ``uv pip sync``, the commands tsm runs;
  and both again with uv's cache warm (what a second machine sharing the cache, or a changed lock, pays)
* ``env_warm_start``  a one-replica app that runs ``python -c pass`` in the (cached) environment, submit to
  end, against the same app run with ``-c python=`` a ready-made venv of the same lock: the difference is
  what tsm adds per launch (reading and hashing the lock, the cache check); the in-process cost of that
  step alone (plan + ensure on a ready key) is given too
* ``env_concurrent``  N processes launching the same new key at once: builds counted, wall time against one
  build alone
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "src", ROOT / "tests"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from _util import emit, private_home  # noqa: E402

from envkit import make_wheel  # noqa: E402


def make_lock(work: Path, packages: int, files: int) -> tuple[Path, Path]:
    """A wheelhouse of ``packages`` wheels and a uv.lock pinning them all; (lock, wheelhouse)."""
    import zipfile

    wheels = work / "wheels"
    names = [f"benchpkg{i:03d}" for i in range(packages)]
    for name in names:
        whl = make_wheel(wheels, "1.0", name=name)
        with zipfile.ZipFile(whl, "a") as z:  # bulk the package up: modules an installer must write
            for k in range(files):
                z.writestr(f"{name}/mod{k:03d}.py", f"VALUE = {k}\n" + "# padding\n" * 40)
    proj = work / "proj"
    proj.mkdir()
    deps = ", ".join(f'"{n}==1.0"' for n in names)
    (proj / "pyproject.toml").write_text(
        f'[project]\nname = "bench"\nversion = "0"\nrequires-python = ">=3.10"\ndependencies = [{deps}]\n')
    subprocess.run([_uv(), "lock", "--quiet", "--offline", "--no-index", "--find-links", str(wheels),
                    "--project", str(proj)], check=True)
    return proj / "uv.lock", wheels


def _uv() -> str:
    from tsm.env.build import uv_bin

    return uv_bin()


def by_hand(lock: Path, wheels: Path, target: Path, env: dict[str, str]) -> float:
    """The lock installed with the uv commands a person would type; seconds."""
    uv = _uv()
    reqs = target.parent / f"{target.name}.txt"
    t0 = time.perf_counter()
    subprocess.run([uv, "export", "--quiet", "--frozen", "--no-emit-project", "--no-header", "--format",
                    "requirements-txt", "--project", str(lock.parent), "-o", str(reqs)], check=True, env=env)
    subprocess.run([uv, "venv", "--quiet", "--python", f"{sys.version_info.major}.{sys.version_info.minor}",
                    str(target)], check=True, env=env)
    subprocess.run([uv, "pip", "sync", "--quiet", "--python", str(target / "bin" / "python"), "--no-index",
                    "--offline", "--find-links", str(wheels), str(reqs)], check=True, env=env)
    return time.perf_counter() - t0


def by_tsm(lock: Path, wheels: Path, root: Path) -> float:
    from tsm.env.build import EnvCache
    from tsm.env.spec import IndexSettings, plan
    from tsm.specs.environment import Environment

    t0 = time.perf_counter()
    EnvCache(root).ensure(plan(Environment(str(lock)), IndexSettings(find_links=(str(wheels),))))
    return time.perf_counter() - t0


def bench_cold(lock: Path, wheels: Path, work: Path, runs: int) -> Path:
    """Cold and uv-cache-warm builds, tsm against by hand; returns a ready-made venv of the lock."""
    rows: dict[str, list[float]] = {"tsm_cold": [], "hand_cold": [], "tsm_uvwarm": [], "hand_uvwarm": []}
    for i in range(runs):
        uv_cache = work / f"uvcache{i}"
        os.environ["UV_CACHE_DIR"] = str(uv_cache)
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
        rows["tsm_cold"].append(by_tsm(lock, wheels, work / f"cache-cold{i}"))
        shutil.rmtree(uv_cache)
        rows["hand_cold"].append(by_hand(lock, wheels, work / f"hand-cold{i}", env))
        rows["tsm_uvwarm"].append(by_tsm(lock, wheels, work / f"cache-warm{i}"))
        rows["hand_uvwarm"].append(by_hand(lock, wheels, work / f"hand-warm{i}", env))
    ms = {k: round(statistics.median(v) * 1000, 1) for k, v in rows.items()}
    emit("env_cold_build", runs=runs, tsm_median_ms=ms["tsm_cold"], by_hand_median_ms=ms["hand_cold"],
         tsm_uv_cache_warm_median_ms=ms["tsm_uvwarm"], by_hand_uv_cache_warm_median_ms=ms["hand_uvwarm"],
         overhead_ratio=round(ms["tsm_cold"] / ms["hand_cold"], 2),
         baseline="uv export + uv venv + uv pip sync of the same lock, by hand")
    return work / "hand-warm0"


def _launch_seconds(runner: object, app: object, cfg: dict[str, object]) -> float:
    t0 = time.perf_counter()
    handle = runner.run(app, "local", cfg=cfg)  # type: ignore[attr-defined]
    status = runner.wait(handle, wait_interval=0.05)  # type: ignore[attr-defined]
    assert status is not None and status.state.name == "SUCCEEDED", status
    return time.perf_counter() - t0


def bench_warm(lock: Path, wheels: Path, venv: Path, runs: int) -> None:
    import tsm
    from tsm.env.options import EnvOptions
    from tsm.runner.api import get_runner
    from tsm.schedulers.local import envs

    env = tsm.Environment(str(lock))
    in_env = tsm.AppDef("inenv", roles=[tsm.Role("r", entrypoint="python", args=["-c", "pass"], environment=env)])
    plain = tsm.AppDef("plain", roles=[tsm.Role("r", entrypoint="python", args=["-c", "pass"])])
    cfg_env: dict[str, object] = {"find_links": [str(wheels)]}
    cfg_venv: dict[str, object] = {"python": str(venv / "bin" / "python")}
    with get_runner() as runner:
        _launch_seconds(runner, in_env, cfg_env)  # builds it (not counted), and warms both paths
        _launch_seconds(runner, plain, cfg_venv)
        a, b = [], []
        for _ in range(runs):
            a.append(_launch_seconds(runner, in_env, cfg_env))
            b.append(_launch_seconds(runner, plain, cfg_venv))
    opts = EnvOptions(find_links=[str(wheels)])
    role = in_env.roles[0]
    inproc = []
    for _ in range(max(runs, 20)):
        t0 = time.perf_counter()
        _python, p = envs.role_python(role, opts, None)
        assert p is not None
        envs.ensure({"r": p.to_dict()})
        inproc.append(time.perf_counter() - t0)
    med_a, med_b = statistics.median(a) * 1000, statistics.median(b) * 1000
    emit("env_warm_start", runs=runs, in_environment_median_ms=round(med_a, 1), ready_venv_median_ms=round(med_b, 1),
         overhead_ms=round(med_a - med_b, 1), in_process_plan_and_check_median_ms=round(statistics.median(inproc) * 1000, 2),
         baseline="the same app with -c python= a ready-made venv of the lock", target="overhead <= 50 ms")


def bench_concurrent(lock: Path, wheels: Path, work: Path, n: int) -> None:
    code = ("import sys\nfrom tsm.env.build import EnvCache\nfrom tsm.env.spec import IndexSettings, plan\n"
            "from tsm.specs.environment import Environment\n"
            "EnvCache(sys.argv[1]).ensure(plan(Environment(sys.argv[2]), IndexSettings(find_links=(sys.argv[3],))))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def launch(root: Path, k: int) -> float:
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", code, str(root), str(lock), str(wheels)], env=env)
                 for _ in range(k)]
        assert all(p.wait() == 0 for p in procs)
        return time.perf_counter() - t0

    one = launch(work / "conc-one", 1)
    many = launch(work / "conc-many", n)
    from tsm.env.build import EnvCache

    emit("env_concurrent", launches=n, builds=len(EnvCache(work / "conc-many").builds()), wall_ms=round(many * 1000, 1),
         one_launch_ms=round(one * 1000, 1), baseline="one launch building the same key alone", target="builds == 1")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="5 packages, 2 runs (a smoke run, not a measurement)")
    p.add_argument("--packages", type=int, default=40)
    p.add_argument("--files", type=int, default=50)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--concurrent", type=int, default=8)
    args = p.parse_args()
    packages, runs, conc = (5, 2, 3) if args.tiny else (args.packages, args.runs, args.concurrent)
    private_home()
    with tempfile.TemporaryDirectory(prefix="tsm-env-bench-") as tmp:
        work = Path(tmp)
        lock, wheels = make_lock(work, packages, args.files)
        venv = bench_cold(lock, wheels, work, runs)
        os.environ["UV_CACHE_DIR"] = str(work / "uvcache-shared")
        bench_warm(lock, wheels, venv, runs * 2)
        bench_concurrent(lock, wheels, work, conc)
    return 0


if __name__ == "__main__":
    sys.exit(main())

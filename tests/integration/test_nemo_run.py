"""A real tool built on TorchX, unchanged, on tsm: NeMo-Run's local experiment under ``python -m tsm.torchx_alias``.

NeMo-Run subclasses TorchX's ``LocalScheduler`` and ``Runner`` and imports some thirty TorchX names; here it
runs with no torchx installed at all, every ``import torchx...`` answered by tsm through the alias. The
pinned NeMo-Run and its dependencies (less torchx) go into a throw-away virtualenv cached outside the
repository, keyed by the pins and the Python version (``$TSM_NEMO_VENV_CACHE``, default
``~/.cache/tsm/nemo-run-venv-<key>``), so a warm run starts in a second; tsm itself comes from this tree
through a ``.pth`` file written on every run, never from the cache. A cold install takes about 45 s.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SRC = Path(__file__).resolve().parents[2] / "src"

#: NeMo-Run itself, installed without its dependencies (they name torchx, which must not be installed).
NEMO_RUN = "nemo-run==0.11.1"
#: NeMo-Run 0.11.1's own requirements, less torchx; leptonai below 0.28 (later ones break its import), and
#: importlib-metadata, which NeMo-Run imports but only gets through torchx's requirements.
DEPENDENCIES = (
    "inquirerpy>=0.3.4", "catalogue>=2.0.10", "fabric>=3.2.2", "fiddle>=0.3.0", "typer>=0.12.3", "rich>=13.7.1",
    "jinja2>=3.1.4", "networkx>=3.3", "omegaconf>=2.3.0", "leptonai==0.27.3", "toml", "importlib-metadata",
)  # fmt: skip


def _venv_key() -> str:
    pins = "\n".join([NEMO_RUN, *DEPENDENCIES, sys.version.split()[0]])
    return hashlib.sha256(pins.encode()).hexdigest()[:16]


def _cached_venv() -> Path:
    """The cached virtualenv with NeMo-Run (built once under a lock, in a temporary dir renamed into place)."""
    root = Path(os.environ.get("TSM_NEMO_VENV_CACHE") or Path.home() / ".cache" / "tsm")
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"nemo-run-venv-{_venv_key()}"
    with open(root / f".nemo-run-{_venv_key()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").exists():
            return venv
        # a venv's scripts name their interpreter by path, so it is built where it lives; the marker written
        # last makes a half-built one (an interrupted run) start over
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--no-deps", NEMO_RUN], check=True)
        subprocess.run([*pip, *DEPENDENCIES], check=True)
        (venv / ".complete").write_text(NEMO_RUN + "\n")
    return venv


@pytest.fixture(scope="module")
def nemo_venv() -> Path:
    venv = _cached_venv()
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    (Path(purelib) / "tsm_under_test.pth").write_text(str(SRC) + "\n")  # tsm from this tree, every run
    return venv


EXPERIMENT = textwrap.dedent(
    """
    import nemo_run as run


    def add(a: int, b: int) -> int:
        print(f"sum={a + b}")
        return a + b


    if __name__ == "__main__":
        run.run(run.Partial(add, a=2, b=3), executor=run.LocalExecutor(), name="tsm-nemo")
    """
)


def test_nemo_run_local_experiment_succeeds_on_tsm(nemo_venv: Path, tmp_path: Path) -> None:
    (tmp_path / "experiment.py").write_text(EXPERIMENT)
    venv_bin = str(nemo_venv / "bin")
    env = {
        **os.environ,
        # the venv activated, as a NeMo-Run user has it: its replicas run `python -m nemo_run...`
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        "VIRTUAL_ENV": str(nemo_venv),
        "TSM_HOME": str(tmp_path / "tsm-home"),
        "NEMORUN_HOME": str(tmp_path / "nemo-home"),
        "COLUMNS": "400",  # rich would wrap "finished: SUCCEEDED" over two lines
        "PYTHONPATH": "",
    }
    env.pop("TSM_TORCHX_ALIAS", None)
    no_torchx = subprocess.run(
        [str(nemo_venv / "bin" / "python"), "-c", "import importlib.util as u; print(u.find_spec('torchx'))"],
        env=env, capture_output=True, text=True, check=True,
    )
    assert no_torchx.stdout.strip() == "None", "the real torchx must not be in the NeMo-Run venv"

    proc = subprocess.run(
        [str(nemo_venv / "bin" / "python"), "-m", "tsm.torchx_alias", "experiment.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "finished: SUCCEEDED" in out, out[-4000:]
    logs = list((tmp_path / "nemo-home").rglob("stdout.log"))
    assert any("sum=5" in p.read_text() for p in logs), [str(p) for p in logs]


#: NeMo-Run's own classes on tsm's TorchX face, checked where its tests check TorchX's behaviour.
BEHAVIOURS = textwrap.dedent(
    """
    import os, tempfile, time
    from unittest import mock

    from torchx.specs import MISSING, AppDef, AppState, Role, runopts
    from nemo_run.core.execution.local import LocalExecutor
    from nemo_run.core.tunnel.client import LocalTunnel
    from nemo_run.run.torchx_backend.schedulers import local, slurm

    # 1. an empty set of run options prints as TorchX prints it
    assert str(runopts()) == "    (no run options)", repr(str(runopts()))

    # 2. NeMo-Run's LocalScheduler subclass runs a role whose image is <MISSING> in the working directory
    sched = local.create_scheduler(session_name="probe")
    app = AppDef("probe", [Role("probe", image=MISSING, entrypoint="echo", args=["probe", "ran"])])
    app_id = sched.schedule(sched._submit_dryrun(app, LocalExecutor(job_dir=tempfile.mkdtemp())))
    deadline = time.monotonic() + 120
    while not sched.describe(app_id).state.is_terminal and time.monotonic() < deadline:
        time.sleep(0.1)

    # 3. describe of an app the scheduler knows answers, also from a new scheduler (NeMo-Run's saved job dirs)
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    again = local.create_scheduler(session_name="probe").describe(app_id)
    assert again is not None and again.state == AppState.SUCCEEDED, again
    assert "".join(sched.log_iter(app_id, "probe")) == "probe ran\\n"

    # 4. Slurm's log_iter yields the lines its log iterator gives, one by one, as TorchX's split_lines_iterator does
    tunnel = LocalTunnel(job_dir=tempfile.mkdtemp())
    with mock.patch.object(slurm, "_get_job_dirs", return_value={"42": (tempfile.mkdtemp(), tunnel, "log*")}), \\
            mock.patch.object(slurm.SlurmTunnelScheduler, "_initialize_tunnel"), \\
            mock.patch.object(slurm.TunnelLogIterator, "__iter__", return_value=iter(["first", "second\\n"])):
        lines = list(slurm.create_scheduler(session_name="probe").log_iter("42", "trainer"))
    assert lines == ["first", "second\\n"], lines
    print("behaviours: ok")
    """
)


def test_nemo_runs_classes_keep_torchxs_behaviour_on_tsm(nemo_venv: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TSM_HOME": str(tmp_path / "tsm-home"), "NEMORUN_HOME": str(tmp_path / "nemo-home"),
           "PYTHONPATH": ""}
    env.pop("TSM_TORCHX_ALIAS", None)
    proc = subprocess.run(
        [str(nemo_venv / "bin" / "python"), "-m", "tsm.torchx_alias", "-c", BEHAVIOURS],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert proc.stdout.strip().endswith("behaviours: ok")


def test_alias_refuses_a_real_torchx_unless_asked_to_shadow(nemo_venv: Path, tmp_path: Path) -> None:
    fake = tmp_path / "site" / "torchx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "TSM_HOME": str(tmp_path / "tsm-home")}
    env.pop("TSM_TORCHX_ALIAS", None)
    python = str(nemo_venv / "bin" / "python")
    code = "import torchx, tsm; print(torchx is tsm)"
    refused = subprocess.run([python, "-m", "tsm.torchx_alias", "-c", code], env=env, capture_output=True, text=True)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "--shadow" in refused.stderr
    shadowed = subprocess.run(
        [python, "-m", "tsm.torchx_alias", "--shadow", "-c", code], env=env, capture_output=True, text=True
    )
    assert shadowed.returncode == 0, shadowed.stderr
    assert shadowed.stdout.strip() == "True"

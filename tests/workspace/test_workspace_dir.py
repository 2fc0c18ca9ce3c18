"""The directory workspace: content-addressed snapshots, reuse by hash, symlink policy, and real jobs.

Jobs run on the real local scheduler (nothing mocked). Counters from the builder's report prove what
was copied; times are not asserted (``benchmarks/workspace_bench.py`` measures them).
"""

from __future__ import annotations

import os
import stat
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testutil import HANG, wait_until
from tsm.runner.api import get_runner
from tsm.specs.api import AppDef, AppState, Role
from tsm.workspace import (
    METADATA_KEY,
    DirWorkspace,
    WorkspaceBuilder,
    WorkspaceError,
    apply_workspace,
    image_tag,
    scan,
)
from tsm.workspace.dir import remove_tree, roles_for_workspace, workspaces_home


def write(root: Path, rel: str, text: str = "x", age: float = 0.0) -> Path:
    """Write a file; ``age`` seconds sets its mtime in the past (older than the stat cache's racy window)."""
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    if age:
        t = time.time() - age
        os.utime(p, (t, t))
    return p


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    write(root, "main.py", "print('hello')\n", age=10)
    write(root, "pkg/mod.py", "X = 1\n", age=10)
    write(root, "pkg/data.txt", "data " * 100, age=10)
    (root / "empty").mkdir()
    tool = write(root, "tool.sh", "#!/bin/sh\necho tool\n", age=10)
    tool.chmod(0o755)
    return root


def test_first_build_copies_everything_second_copies_nothing(ws: Path) -> None:
    first = DirWorkspace().build(ws)
    assert not first.reused
    assert (first.files, first.files_copied, first.files_linked) == (4, 4, 4)
    assert first.bytes_copied == first.bytes == sum(p.stat().st_size for p in ws.rglob("*") if p.is_file())
    second = DirWorkspace().build(ws)
    assert second.reused and second.snapshot == first.snapshot and second.digest == first.digest
    assert (second.files_copied, second.bytes_copied, second.files_linked) == (0, 0, 0)
    assert second.files_hashed == 0, "unchanged files must come from the stat cache, not be read again"


def test_snapshot_is_a_read_only_copy_with_the_same_tree(ws: Path) -> None:
    snap = Path(DirWorkspace().build(ws).snapshot)
    assert (snap / "main.py").read_text() == "print('hello')\n"
    assert (snap / "empty").is_dir()
    assert os.access(snap / "tool.sh", os.X_OK) and not os.access(snap / "main.py", os.X_OK)
    assert stat.S_IMODE((snap / "main.py").stat().st_mode) == 0o444
    assert stat.S_IMODE((snap / "pkg").stat().st_mode) == 0o555
    assert stat.S_IMODE(workspaces_home().stat().st_mode) == 0o700
    # a snapshot file is never the user's file: an in-place edit of the workspace cannot reach it
    assert (snap / "main.py").stat().st_ino != (ws / "main.py").stat().st_ino
    with open(ws / "main.py", "a") as f:
        f.write("# edited in place\n")
    assert (snap / "main.py").read_text() == "print('hello')\n"


def test_one_changed_file_copies_one_file_and_links_the_rest(ws: Path) -> None:
    first = DirWorkspace().build(ws)
    write(ws, "pkg/mod.py", "X = 2\n")
    second = DirWorkspace().build(ws)
    assert second.digest != first.digest and second.snapshot != first.snapshot
    assert (second.files_copied, second.bytes_copied) == (1, len("X = 2\n"))
    assert second.files_linked == 4
    assert second.files_hashed == 1, "only the changed file is read"
    a, b = Path(first.snapshot), Path(second.snapshot)
    assert (a / "pkg/data.txt").stat().st_ino == (b / "pkg/data.txt").stat().st_ino  # shared, not copied
    assert (a / "pkg/mod.py").read_text() == "X = 1\n" and (b / "pkg/mod.py").read_text() == "X = 2\n"


def test_dry_run_says_what_would_be_copied_and_writes_no_snapshot(ws: Path) -> None:
    dry = DirWorkspace().build(ws, dry=True)
    assert dry.dry and not dry.reused and dry.files_copied == 4 and dry.bytes_copied == dry.bytes
    assert not Path(dry.snapshot).exists()
    assert "would copy 4 files" in dry.summary()
    DirWorkspace().build(ws)
    again = DirWorkspace().build(ws, dry=True)
    assert again.reused and "would reuse" in again.summary()


def test_same_content_twice_is_stored_once(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "a.txt", "same")
    write(root, "b/c.txt", "same")
    report = DirWorkspace().build(root)
    assert report.files_copied == 1 and report.files_linked == 2


def test_symlink_inside_is_kept_relative_and_absolute_ones_are_rewritten(ws: Path) -> None:
    (ws / "link_rel").symlink_to("pkg/mod.py")
    (ws / "link_abs").symlink_to(ws / "pkg" / "data.txt")
    (ws / "dangling").symlink_to("nowhere")
    snap = Path(DirWorkspace().build(ws).snapshot)
    assert os.readlink(snap / "link_rel") == "pkg/mod.py"
    assert os.readlink(snap / "link_abs") == "pkg/data.txt"  # points into the snapshot, not the live tree
    assert (snap / "link_abs").resolve().is_relative_to(snap.resolve())
    assert os.readlink(snap / "dangling") == "nowhere"


@pytest.mark.parametrize(
    "make_link",
    [
        pytest.param(lambda ws: (ws / "esc").symlink_to("/etc/passwd"), id="absolute-outside"),
        pytest.param(lambda ws: (ws / "esc").symlink_to("../outside.txt"), id="relative-dotdot"),
        pytest.param(lambda ws: ((ws / "d").symlink_to("."), (ws / "esc").symlink_to("d/../outside.txt")),
                     id="lexically-inside-really-outside"),
        pytest.param(lambda ws: (ws / "pkg" / "up").symlink_to("../.."), id="dir-link-above-root"),
    ],
)
def test_symlink_pointing_outside_is_refused(ws: Path, make_link: object) -> None:
    (ws.parent / "outside.txt").write_text("secret")
    make_link(ws)  # type: ignore[operator]
    with pytest.raises(WorkspaceError, match="points outside the workspace"):
        DirWorkspace().build(ws)
    assert not any((workspaces_home() / "snapshots").iterdir()), "nothing is snapshotted"


def test_escaping_symlink_that_is_ignored_is_fine(ws: Path) -> None:
    (ws / "esc").symlink_to("/etc")
    write(ws, ".tsmignore", "esc\n")
    report = DirWorkspace().build(ws)
    assert not (Path(report.snapshot) / "esc").exists() and "esc" in report.ignored


def test_special_files_are_skipped_and_listed(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    report = DirWorkspace().build(ws)
    assert report.skipped == ["pipe"] and not (Path(report.snapshot) / "pipe").exists()
    assert "skipped special files: pipe" in report.summary()


def test_tsm_home_inside_the_workspace_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "proj"
    write(root, "main.py", "1")
    monkeypatch.setenv("TSM_HOME", str(root / ".tsm"))
    report = DirWorkspace().build(root)
    assert ".tsm/" in report.ignored and report.files == 1


@pytest.mark.parametrize("bad", ["", "does-not-exist", "main.py"])
def test_a_workspace_that_is_not_a_directory_is_refused(ws: Path, bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ws)
    with pytest.raises(WorkspaceError):
        DirWorkspace().build(bad)


def test_a_snapshot_changed_after_it_was_built_is_not_reused(ws: Path) -> None:
    first = DirWorkspace().build(ws)
    snap = Path(first.snapshot)
    snap.chmod(0o755)  # what only root (or the owner, deliberately) can do
    (snap / "stray.txt").write_text("left by a job")
    second = DirWorkspace().build(ws)
    assert second.digest == first.digest and second.snapshot == first.snapshot + "-2"
    assert not (Path(second.snapshot) / "stray.txt").exists()
    assert second.files_copied == 0, "the objects are intact: only links are made"
    remove_tree(snap)


def test_manifest_digest_ignores_mtimes_and_sees_the_exec_bit(ws: Path) -> None:
    d1 = scan(ws).digest
    os.utime(ws / "main.py", (1, 1))
    assert scan(ws).digest == d1
    (ws / "main.py").chmod(0o755)
    assert scan(ws).digest != d1
    assert image_tag(d1, "sha256:base") == image_tag(d1, "sha256:base") != image_tag(d1, "sha256:other")


def test_roles_with_their_own_image_keep_it(ws: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    app = AppDef("a", roles=[Role("none"), Role("same", image=str(ws)), Role("other", image=str(other))])
    assert [r.name for r in roles_for_workspace(app, str(ws))] == ["none", "same"]
    report = apply_workspace(app, str(ws))
    assert report is not None
    assert app.roles[0].image == app.roles[1].image == report.snapshot and app.roles[2].image == str(other)
    assert app.roles[0].metadata[METADATA_KEY]["digest"] == report.digest
    assert app.roles[0].env["PYTHONPYCACHEPREFIX"].startswith(str(workspaces_home()))
    assert apply_workspace(app, "") is None and apply_workspace(app, None) is None


# -- real jobs on the local scheduler --------------------------------------------------------------------
@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    with get_runner() as r:
        yield r
        for app in r.list("local"):
            if not app.state.is_terminal:
                r.cancel(app.app_handle)


JOB = textwrap.dedent(
    """
    import os, sys, time
    go = sys.argv[1]
    open(go + ".started", "w").close()
    while not os.path.exists(go):
        time.sleep(0.02)
    from pkg import mod
    print("cwd", os.getcwd())
    print("mod", mod.X)
    print("data", open("pkg/data.txt").read().strip())
    """
)


def job_app(ws: Path, go: Path) -> AppDef:
    write(ws, "main.py", JOB)
    return AppDef("wsjob", roles=[Role("main", entrypoint=sys.executable, args=["main.py", str(go)])])


def output(runner: object, handle: str) -> list[str]:
    return [line.rstrip("\n") for line in runner.log_lines(handle, "main", 0)]  # type: ignore[attr-defined]


def test_editing_the_workspace_after_submit_changes_nothing_for_the_running_job(runner: object, ws: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    app = job_app(ws, go)
    report = apply_workspace(app, str(ws))
    assert report is not None
    handle = runner.run(app, scheduler="local")  # type: ignore[attr-defined]
    wait_until(lambda: Path(str(go) + ".started").exists(), "the job to start", timeout=HANG)
    # the user keeps working: edit a module in place, replace a data file, delete and add files
    with open(ws / "pkg" / "mod.py", "w") as f:
        f.write("X = 'edited'\n")
    write(ws, "pkg/data.txt", "replaced")
    (ws / "tool.sh").unlink()
    write(ws, "new.py", "new")
    go.touch()
    status = runner.wait(handle, timeout=HANG)  # type: ignore[attr-defined]
    assert status.state == AppState.SUCCEEDED, status
    lines = output(runner, handle)
    assert f"cwd {report.snapshot}" in lines
    assert "mod 1" in lines and "data " + ("data " * 100).strip() in lines
    assert runner.describe(handle).roles[0].metadata[METADATA_KEY]["snapshot"] == report.snapshot  # type: ignore[attr-defined]


def test_second_run_of_an_unchanged_tree_copies_nothing_and_runs_in_the_same_snapshot(
    runner: object, ws: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    go.touch()
    app = job_app(ws, go)
    os.utime(ws / "main.py", (time.time() - 10, time.time() - 10))
    first = apply_workspace(app, str(ws))
    h1 = runner.run(app, scheduler="local")  # type: ignore[attr-defined]
    app2 = job_app(ws, go)
    os.utime(ws / "main.py", (time.time() - 10, time.time() - 10))
    second = apply_workspace(app2, str(ws))
    assert first is not None and second is not None
    assert second.reused and (second.files_copied, second.bytes_copied, second.files_linked) == (0, 0, 0)
    h2 = runner.run(app2, scheduler="local")  # type: ignore[attr-defined]
    for h in (h1, h2):
        assert runner.wait(h, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[attr-defined]
        assert f"cwd {first.snapshot}" in output(runner, h)
    # Python's bytecode went to the pycache prefix, not into the shared snapshot
    assert not (Path(first.snapshot) / "pkg" / "__pycache__").exists()
    assert DirWorkspace().build(ws).reused


def test_concurrent_launches_of_one_tree_share_one_snapshot(ws: Path) -> None:
    """Four processes snapshot the same tree at once: all succeed, one snapshot, no half-built leftovers."""
    import json
    import subprocess

    code = "import json, sys; from tsm.workspace import DirWorkspace; print(json.dumps(DirWorkspace().build(sys.argv[1]).to_dict()))"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(ws)], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    reports = [json.loads(p.communicate(timeout=HANG)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len({r["snapshot"] for r in reports}) == 1
    assert [p.name for p in (workspaces_home() / "snapshots").iterdir()] == [reports[0]["digest"]]
    assert list((workspaces_home() / "tmp").iterdir()) == []
    assert sum(r["bytes_copied"] for r in reports) >= reports[0]["bytes"]  # someone copied; nobody failed


def test_summary_line_from_role_metadata(ws: Path) -> None:
    from tsm.workspace.dir import workspace_summary

    app = AppDef("a", roles=[Role("main"), Role("side", image="/elsewhere")])
    assert workspace_summary(app) is None
    apply_workspace(app, str(ws))
    first = workspace_summary(app)
    assert first is not None and "new snapshot: copied 4 files" in first and "(roles: main)" in first
    app2 = AppDef("a", roles=[Role("main")])
    apply_workspace(app2, str(ws))
    assert "reused the existing snapshot, copying nothing" in (workspace_summary(app2) or "")


def test_leftovers_of_a_killed_launch_are_removed_later(ws: Path) -> None:
    tmp = workspaces_home() / "tmp"
    stale, fresh = tmp / "snap-dead", tmp / "snap-running"
    for d in (stale, fresh):
        (d / "sub").mkdir(parents=True)
        (d / "sub").chmod(0o555)
    old = time.time() - 2 * 24 * 3600
    os.utime(stale, (old, old))
    DirWorkspace().build(ws)
    assert not stale.exists() and fresh.exists()
    remove_tree(fresh)


def test_context_tar_for_container_builders_is_deterministic(ws: Path) -> None:
    import hashlib
    import io
    import tarfile

    from tsm.workspace.dir import write_context_tar

    (ws / "link").symlink_to("main.py")
    snap = DirWorkspace().build(ws).snapshot
    blobs = []
    for _ in range(2):
        buf = io.BytesIO()
        write_context_tar(snap, buf, {"Dockerfile": b"FROM base\nCOPY . /ws\n"})
        blobs.append(buf.getvalue())
    assert hashlib.sha256(blobs[0]).digest() == hashlib.sha256(blobs[1]).digest()
    with tarfile.open(fileobj=io.BytesIO(blobs[0])) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert {"main.py", "pkg", "pkg/mod.py", "tool.sh", "empty", "link", "Dockerfile"} <= set(members)
        assert members["tool.sh"].mode == 0o755 and members["main.py"].mode == 0o644
        assert members["link"].issym() and members["link"].linkname == "main.py"
        assert tar.extractfile("pkg/mod.py").read() == b"X = 1\n"  # type: ignore[union-attr]


def test_container_and_torchx_style_builders_get_the_first_role(ws: Path) -> None:
    """A builder other than the directory one (a container backend, a TorchX-style plugin) gets role 0, as in TorchX."""
    from collections.abc import Mapping as _Mapping

    class Images(WorkspaceBuilder[None]):
        def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: _Mapping[str, object]) -> None:
            role.image = image_tag(scan(workspace).digest, role.image)

        def dryrun_push_images(self, app: AppDef, cfg: _Mapping[str, object]) -> None:
            return None

        def push_images(self, images_to_push: None) -> None:
            return None

    class TorchxStyle:
        def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: object) -> None:
            role.image = "patched:" + role.image

    app = AppDef("a", roles=[Role("a", image="py:3"), Role("b", image="py:3")])
    assert apply_workspace(app, str(ws), {}, Images()) is None
    assert app.roles[0].image.startswith("tsm-workspace:") and app.roles[1].image == "py:3"
    app2 = AppDef("a", roles=[Role("a", image="py:3"), Role("b", image="py:3")])
    apply_workspace(app2, str(ws), {}, TorchxStyle())  # type: ignore[arg-type]
    assert [r.image for r in app2.roles] == ["patched:py:3", "py:3"]

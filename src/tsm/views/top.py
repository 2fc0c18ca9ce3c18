"""``tsm top``: a full-screen terminal view of apps, their replicas and a followed log (Textual).

Layout: a filter line, the app table, the selected app's replicas (with CPU sparklines), and a log pane
following the selected replica. Keys:

====== ================================================================================
``/``  edit the filter (``state:RUNNING``, ``scheduler:local``, ``state:FAILED,CANCELLED``, name words)
``f``  cycle a state filter: all, RUNNING, FAILED, SUCCEEDED, CANCELLED
``l``  follow the log of the replica under the cursor in the replica table
``c``  cancel the selected app (asks for confirmation: ``y`` / ``n``)
``r``  refresh now
``q``  quit
====== ================================================================================

The snapshot refreshes every ``interval`` seconds in a worker thread (one batched call per scheduler;
see :mod:`tsm.views.snapshot`). All user text (names, errors, log lines) is shown as plain text, never as
Rich markup. Needs the ``views`` extra (``pip install 'tsm[views]'``).
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Label, Log, Static

from tsm.views.snapshot import AppView, Snapshot, SnapshotCollector
from tsm.views.text import (
    APP_COLUMNS,
    REPLICA_COLUMNS,
    app_cells,
    matches,
    printable,
    replica_cells,
    sparkline,
)

#: The state filters ``f`` cycles through.
STATE_FILTERS = ("", "RUNNING", "FAILED", "SUCCEEDED", "CANCELLED")
#: CPU samples kept per replica for its sparkline.
SPARK_POINTS = 20


class ConfirmCancel(ModalScreen[bool]):
    """Asks "cancel APP?"; dismissed with True on ``y``, False on ``n`` or Escape."""

    BINDINGS: ClassVar[list[Any]] = [
        Binding("y", "answer(True)", "yes"), Binding("n", "answer(False)", "no"),
        Binding("escape", "answer(False)", "no"),
    ]
    DEFAULT_CSS = """
    ConfirmCancel { align: center middle; }
    ConfirmCancel > Label { border: thick $error; padding: 1 2; background: $surface; }
    """

    def __init__(self, app_view: AppView) -> None:
        super().__init__()
        self.target = app_view

    def compose(self) -> ComposeResult:
        yield Label(Text(f"Cancel {printable(self.target.name)} ({self.target.handle})?  y / n"), id="question")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class TopApp(App[None]):
    """The ``tsm top`` application."""

    TITLE = "tsm top"
    CSS = """
    #filter { height: 3; }
    #apps { height: 1fr; }
    #replicas { height: 1fr; }
    #log { height: 1fr; border-top: solid $accent; }
    #status { height: 1; color: $text-muted; }
    """
    BINDINGS: ClassVar[list[Any]] = [
        Binding("q", "quit", "quit"), Binding("slash", "focus_filter", "filter"),
        Binding("f", "cycle_state", "state filter"), Binding("c", "cancel_app", "cancel app"),
        Binding("l", "follow_log", "follow log"), Binding("r", "refresh_now", "refresh"),
        Binding("escape", "focus_apps", "apps", show=False),
    ]

    def __init__(self, collector: SnapshotCollector | None = None, runner: Any = None, interval: float = 1.0,
                 query: str = "") -> None:
        super().__init__()
        self._collector = collector
        self._runner = runner
        self.interval = interval
        self.query_text = query
        self.state_filter = ""
        self.snapshot: Snapshot | None = None
        self.selected: str | None = None  # handle of the app under the cursor
        self.following: tuple[str, str, int] | None = None
        self._stop_follow = threading.Event()
        self._cpu: dict[tuple[str, str, int], list[float]] = {}
        self._lock = threading.Lock()

    # -- plumbing ----------------------------------------------------------------------------------
    @property
    def runner(self) -> Any:
        if self._runner is None:
            from tsm.runner.api import get_runner

            self._runner = get_runner()
        return self._runner

    @property
    def collector(self) -> SnapshotCollector:
        if self._collector is None:
            self._collector = SnapshotCollector()
        return self._collector

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Input(self.query_text, placeholder="filter: state:RUNNING scheduler:local NAME  (press / )",
                        id="filter")
            yield DataTable(id="apps", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="replicas", cursor_type="row")
            yield Static("", id="status")
            yield Log(id="log", max_lines=5000)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#apps", DataTable).add_columns(*APP_COLUMNS)
        self.query_one("#replicas", DataTable).add_columns(*REPLICA_COLUMNS[:6], "CPU (recent)", *REPLICA_COLUMNS[6:])
        self.query_one("#apps", DataTable).focus()
        self.refresh_snapshot()
        self.set_interval(self.interval, self.refresh_snapshot)

    def on_unmount(self) -> None:
        self._stop_follow.set()

    async def action_quit(self) -> None:
        self._stop_follow.set()
        self.exit()

    # -- refresh -----------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="refresh")
    def refresh_snapshot(self) -> None:
        with self._lock:
            snap = self.collector.refresh()
        self.call_from_thread(self.show, snap)

    def show(self, snap: Snapshot) -> None:
        """Redraw the tables from ``snap``, keeping the cursor on the same app."""
        self.snapshot = snap
        for a in snap.apps:
            for r in a.replicas:
                if r.cpu_used is not None:
                    pts = self._cpu.setdefault((a.handle, r.role, r.idx), [])
                    pts.append(r.cpu_used)
                    del pts[:-SPARK_POINTS]
        query = (self.query_text + (f" state:{self.state_filter}" if self.state_filter else "")).strip()
        apps = [a for a in snap.apps if matches(a, query)]
        table = self.query_one("#apps", DataTable)
        keep = self.selected
        handles = [a.handle for a in apps]
        _fill(table, [(a.handle, [Text(printable(c)) for c in app_cells(a, snap.taken)]) for a in apps])
        if keep in handles:
            table.move_cursor(row=handles.index(keep), animate=False)
        self.selected = handles[table.cursor_row] if handles and 0 <= table.cursor_row < len(handles) else None
        self._show_replicas()
        errors = "; ".join(f"{k}: {v}" for k, v in snap.errors.items())
        self.query_one("#status", Static).update(Text(
            f"{len(apps)}/{len(snap.apps)} apps"
            + (f" · filter {query!r}" if query else "")
            + (f" · log {self.following[1]}/{self.following[2]}" if self.following else "")
            + (f" · {errors}" if errors else "")))

    def _show_replicas(self) -> None:
        table = self.query_one("#replicas", DataTable)
        row = table.cursor_row
        app = self._app(self.selected)
        rows: list[tuple[str, list[Text]]] = []
        for r in app.replicas if app is not None else []:
            cells = [Text(printable(c)) for c in replica_cells(r)]
            spark = Text(sparkline(self._cpu.get((app.handle, r.role, r.idx), []))) if app is not None else Text()
            rows.append((f"{app.handle if app else ''} {r.role}/{r.idx}", [*cells[:6], spark, *cells[6:]]))
        _fill(table, rows)
        if app is not None and app.replicas:
            table.move_cursor(row=min(max(row, 0), len(app.replicas) - 1), animate=False)
            if self.following is None or self.following[0] != app.handle:
                self._follow(app.handle, app.replicas[0].role, app.replicas[0].idx)

    def _app(self, handle: str | None) -> AppView | None:
        return None if self.snapshot is None or handle is None else self.snapshot.app(handle)

    # -- events and actions ------------------------------------------------------------------------
    @on(DataTable.RowHighlighted, "#apps")
    def _app_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.cursor_row != event.data_table.cursor_row:
            return  # stale: the table was rebuilt since
        handle = event.row_key.value if event.row_key is not None else None
        if handle != self.selected:
            self.selected = handle
            self._show_replicas()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.query_text = event.value
        if self.snapshot is not None:
            self.show(self.snapshot)

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        self.query_one("#apps", DataTable).focus()

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_focus_apps(self) -> None:
        self.query_one("#apps", DataTable).focus()

    def action_cycle_state(self) -> None:
        self.state_filter = STATE_FILTERS[(STATE_FILTERS.index(self.state_filter) + 1) % len(STATE_FILTERS)]
        if self.snapshot is not None:
            self.show(self.snapshot)

    def action_refresh_now(self) -> None:
        self.refresh_snapshot()

    def action_follow_log(self) -> None:
        app = self._app(self.selected)
        table = self.query_one("#replicas", DataTable)
        if app is None or not app.replicas:
            return
        r = app.replicas[min(max(table.cursor_row, 0), len(app.replicas) - 1)]
        self._follow(app.handle, r.role, r.idx)

    def action_cancel_app(self) -> None:
        app = self._app(self.selected)
        if app is None or app.terminal:
            self.notify("no running app selected", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._cancel(app.handle)

        self.push_screen(ConfirmCancel(app), answered)

    @work(thread=True, group="cancel")
    def _cancel(self, handle: str) -> None:
        with self._lock:
            self.runner.cancel(handle)
        self.call_from_thread(self.notify, f"cancelled {handle}")
        self.call_from_thread(self.refresh_snapshot)

    # -- log pane ----------------------------------------------------------------------------------
    def _follow(self, handle: str, role: str, k: int) -> None:
        self._stop_follow.set()
        self._stop_follow = threading.Event()
        self.following = (handle, role, k)
        log = self.query_one("#log", Log)
        log.clear()
        log.write_line(f"── {handle} {role}/{k} ──")
        # A daemon thread, not a Textual worker: the scheduler's follower blocks until a line or the
        # replica's end, and quitting must not wait for a silent replica. After a switch (or quit) the
        # thread ends at the old replica's next line or its end, writing nothing more.
        threading.Thread(target=self._pump, args=(handle, role, k, self._stop_follow), daemon=True,
                         name=f"top log {handle} {role}/{k}").start()

    def _write_log(self, stop: threading.Event, line: str) -> None:
        if not stop.is_set():
            self.query_one("#log", Log).write_line(line)

    def _pump(self, handle: str, role: str, k: int, stop: threading.Event) -> None:
        from tsm.runner.api import get_runner

        try:
            with get_runner() as runner:
                for line in runner.log_lines(handle, role, k, should_tail=True):
                    if stop.is_set():
                        return
                    self._send(stop, printable(line.rstrip("\n")) or " ")
        except Exception as e:  # noqa: BLE001 - shown in the pane, the view keeps going
            self._send(stop, f"── log unavailable: {type(e).__name__}: {e} ──")
            return
        self._send(stop, "── replica ended ──")

    def _send(self, stop: threading.Event, line: str) -> None:
        """Hand a line to the UI thread; nothing once the pane follows another replica or the app ended."""
        if stop.is_set():
            return
        try:
            self.call_from_thread(self._write_log, stop, line)
        except RuntimeError:  # the app has exited
            stop.set()


def _fill(table: DataTable[Any], rows: list[tuple[str, list[Text]]]) -> None:
    """Show ``rows`` (key, cells): cells are updated in place when the keys are the same as shown, so the
    cursor and scroll position stay; otherwise the table is rebuilt."""
    if [k.value for k in table.rows] == [key for key, _ in rows]:
        columns = list(table.columns)
        for key, cells in rows:
            for col, cell in zip(columns, cells, strict=True):
                if table.get_cell(key, col) != cell:
                    table.update_cell(key, col, cell)
        return
    table.clear()
    for key, cells in rows:
        table.add_row(*cells, key=key)

"""``tsm top``: a full-screen terminal view of apps, their replicas and a followed log (Textual).

Layout: a filter line, the app table, the selected app's replicas (with CPU sparklines), and a log pane
following the selected replica. Keys:

====== ================================================================================
``/``  edit the filter (``state:RUNNING``, ``scheduler:local``, ``state:FAILED,CANCELLED``, name words)
``f``  cycle a state filter: all, RUNNING, FAILED, SUCCEEDED, CANCELLED
``l``  follow the log of the replica under the cursor in the replica table
``e``  expand or fold the sweep under the cursor (also Enter): a sweep's trials are folded under one line
``c``  cancel the selected app (asks for confirmation: ``y`` / ``n``)
``r``  refresh now
``q``  quit
====== ================================================================================

The snapshot refreshes every ``interval`` seconds in a worker thread (one batched call per scheduler;
see :mod:`tsm.views.snapshot`), measuring usage and last log lines for the selected app only (the only
one whose replicas are shown), and the tables draw again only the cells whose text changed: with 100
running local apps at 1 Hz the view uses about 3.2 % of one core (4.5 % with 1,000 running replicas) (``benchmarks/views_bench.py``). All user text (names, errors, log lines) is shown as plain text, never as
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

from tsm.schedulers.common.viewmodel import AppSummary
from tsm.views.snapshot import Snapshot, SnapshotCollector
from tsm.views.text import (
    APP_COLUMNS,
    REPLICA_COLUMNS,
    fold_rows,
    matches,
    printable,
    replica_cells,
    row_cells,
    sparkline,
)

#: The state filters ``f`` cycles through.
STATE_FILTERS = ("", "RUNNING", "FAILED", "SUCCEEDED", "CANCELLED")
#: CPU samples kept per replica for its sparkline.
SPARK_POINTS = 20


class _Table(DataTable[Any]):
    """A :class:`DataTable` that draws again only the cells whose value changed.

    Textual's own cell cache is keyed on a table-wide update count, so updating the AGE cell of one row
    draws every visible cell again; a 1 Hz view of 100 apps, whose ages change every second, spent most
    of its CPU there. Here a drawn cell is kept with the value it was drawn from (the very object) and
    its position, style, width and focus state, and reused while they are the same. Anything this does
    not recognise (a header, or a Textual whose internals differ) is left to the table itself.
    """

    #: drawn cells kept at most (the table's visible cells, many times over)
    MAX_CELLS = 20000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._drawn: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def _render_cell(self, row_index: int, column_index: int, base_style: Any, width: int,
                     cursor: bool = False, hover: bool = False) -> Any:
        try:
            row_key = self._row_locations.get_key(row_index)
            column_key = self._column_locations.get_key(column_index)
            if row_key is None or column_key is None:  # the header or the row labels
                return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
            value = self._data[row_key][column_key]
            key = (row_key, column_key, row_index, column_index, base_style, width, cursor, hover,
                   self.show_cursor, self._show_hover_cursor, self._pseudo_class_state)
        except (AttributeError, KeyError, TypeError):
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        hit = self._drawn.get(key)
        if hit is not None and hit[0] is value:
            return hit[1]
        lines = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        if len(self._drawn) >= self.MAX_CELLS:
            self._drawn.clear()
        self._drawn[key] = (value, lines)
        return lines


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

    def __init__(self, app_view: AppSummary) -> None:
        super().__init__()
        self.target = app_view

    def compose(self) -> ComposeResult:
        yield Label(Text(f"Cancel {printable(self.target.name)} ({printable(self.target.handle)})?  y / n"), id="question")

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
        Binding("l", "follow_log", "follow log"), Binding("e", "toggle_sweep", "expand sweep"),
        Binding("r", "refresh_now", "refresh"),
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
        self._status = ""
        self._shown_apps: dict[str, list[str]] = {}  # what each table shows (see _fill)
        self._shown_replicas: dict[str, list[str]] = {}
        self.expanded: set[str] = set()  # handles of the sweeps whose trials are shown

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
            yield _Table(id="apps", cursor_type="row", zebra_stripes=True)
            yield _Table(id="replicas", cursor_type="row")
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
        with self._lock:  # usage and last lines are shown for the selected app only: measured for it only
            snap = self.collector.refresh(detail={self.selected} if self.selected else set())
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
        rows = fold_rows(snap, query, self.expanded)  # a sweep's trials under one line (see views/text.py)
        table = self.query_one("#apps", DataTable)
        # the app under the cursor now: a move whose highlight event is not handled yet (a key just pressed)
        # is what the user sees selected, and a refresh in between must not take the cursor back
        shown = [k.value for k in table.rows]
        keep = shown[table.cursor_row] if 0 <= table.cursor_row < len(shown) else self.selected
        handles = [r.key for r in rows]
        _fill(table, [(r.key, [printable(c) for c in row_cells(r, snap.taken, self.expanded)]) for r in rows],
              self._shown_apps)
        if keep in handles:
            table.move_cursor(row=handles.index(keep), animate=False)
        self.selected = handles[table.cursor_row] if handles and 0 <= table.cursor_row < len(handles) else None
        self._show_replicas()
        errors = printable("; ".join(f"{k}: {v}" for k, v in snap.errors.items()))
        status = (f"{len(apps)}/{len(snap.apps)} apps"
                  + (f" · filter {query!r}" if query else "")
                  + (f" · log {printable(self.following[1])}/{self.following[2]}" if self.following else "")
                  + (f" · {errors}" if errors else ""))
        if status != self._status:  # an update lays the whole screen out again: only when it changed
            self._status = status
            self.query_one("#status", Static).update(Text(status), layout=False)

    def _show_replicas(self) -> None:
        table = self.query_one("#replicas", DataTable)
        row = table.cursor_row
        app = self._app(self.selected)
        rows: list[tuple[str, list[str]]] = []
        for r in app.replicas if app is not None else []:
            cells = [printable(c) for c in replica_cells(r)]
            spark = sparkline(self._cpu.get((app.handle, r.role, r.idx), [])) if app is not None else ""
            rows.append((f"{app.handle if app else ''} {r.role}/{r.idx}", [*cells[:6], spark, *cells[6:]]))
        _fill(table, rows, self._shown_replicas)
        if app is not None and app.replicas:
            table.move_cursor(row=min(max(row, 0), len(app.replicas) - 1), animate=False)
            if self.following is None or self.following[0] != app.handle:
                self._follow(app.handle, app.replicas[0].role, app.replicas[0].idx)

    def _app(self, handle: str | None) -> AppSummary | None:
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
            self.refresh_snapshot()  # its usage and last lines were not measured while it was not selected

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

    @on(DataTable.RowSelected, "#apps")
    def _app_selected(self) -> None:
        self.action_toggle_sweep()

    def action_toggle_sweep(self) -> None:
        """Expand the sweep under the cursor to show its trials, or fold them back under its line."""
        if self.snapshot is None or self.selected is None:
            return
        if not any(g.handle == self.selected for g in self.snapshot.sweeps):
            return
        self.expanded ^= {self.selected}
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
        self.call_from_thread(self.notify, f"cancelled {printable(handle)}")
        self.call_from_thread(self.refresh_snapshot)

    # -- log pane ----------------------------------------------------------------------------------
    def _follow(self, handle: str, role: str, k: int) -> None:
        self._stop_follow.set()
        self._stop_follow = threading.Event()
        self.following = (handle, role, k)
        log = self.query_one("#log", Log)
        log.clear()
        log.write_line(f"── {printable(handle)} {printable(role)}/{k} ──")
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
            self._send(stop, f"── log unavailable: {printable(f'{type(e).__name__}: {e}')} ──")
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


def _fill(table: DataTable[Any], rows: list[tuple[str, list[str]]], shown: dict[str, list[str]]) -> None:
    """Show ``rows`` (key, cells as plain text): only the cells whose text changed are updated, when the keys
    are the same as shown, so the cursor and scroll position stay and an unchanged table is not drawn again
    (any update makes the table draw every visible cell); otherwise the table is rebuilt. The text shown
    is kept in ``shown`` (row key -> cells, one dict per table, updated here), so comparing costs no
    :class:`~rich.text.Text` per cell."""
    if list(shown) == [key for key, _ in rows] and len(shown) == table.row_count:
        columns = list(table.columns)
        for key, cells in rows:
            old = shown[key]
            for i, (col, cell) in enumerate(zip(columns, cells, strict=True)):
                if old[i] != cell:
                    table.update_cell(key, col, Text(cell))
            shown[key] = cells
        return
    table.clear()
    for key, cells in rows:
        table.add_row(*(Text(c) for c in cells), key=key)
    shown.clear()
    shown.update(rows)

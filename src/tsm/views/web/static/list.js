// The list pane: every app of the snapshot that passes the filters, each sweep's trials folded under one
// line (open when the sweep, or one of its trials, is what the detail shows). Rows are kept per app and per
// sweep and only their text changes on a refresh, so the row under the pointer stays the same element.
import { $, badge, el, fmtDur, placeRows, setText } from "./dom.js";
import { appLink, sweepLink } from "./route.js";

const TERMINAL_SWEEP = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const rows = new Map();   // "app:<handle>" | "sweep:<handle>" -> <tr>
let order = [];           // the rows' routes as shown, for j / k: [{view, handle}]

// Whether `app` passes the text filter: words "state:X[,Y]" and "scheduler:X" match exactly (as in tsm top),
// any other word must be in the name or the handle.
export function matchesText(app, q) {
  for (const word of (q || "").trim().split(/\s+/).filter(Boolean)) {
    const [key, ...rest] = word.split(":");
    const value = rest.join(":").toLowerCase();
    if (rest.length && ["state", "scheduler", "sched"].includes(key.toLowerCase())) {
      const field = key.toLowerCase() === "state" ? app.state : app.scheduler;
      if (!value.split(",").filter(Boolean).includes(String(field).toLowerCase())) return false;
    } else if (!(app.name + " " + app.handle).toLowerCase().includes(word.toLowerCase())) {
      return false;
    }
  }
  return true;
}

function matches(app, f, sweepOf) {
  if (f.state && app.state !== f.state) return false;
  if (f.scheduler && app.scheduler !== f.scheduler) return false;
  if (f.sweep === "none" && sweepOf.has(app.handle)) return false;
  if (f.sweep && f.sweep !== "none" && (sweepOf.get(app.handle) || {}).handle !== f.sweep) return false;
  return matchesText(app, f.q);
}

// The rows to show, in order (see the module comment): {kind: "app", app, depth} (depth 1: a trial under its
// sweep's line) and {kind: "sweep", sweep, trials, open}.
export function foldRows(snap, f, route) {
  const sweepOf = new Map();
  for (const g of snap.sweeps || []) for (const h of g.trials) sweepOf.set(h, g);
  const trialsOf = new Map();
  for (const a of snap.apps) {
    const g = sweepOf.get(a.handle);
    if (g) { if (!trialsOf.has(g.handle)) trialsOf.set(g.handle, []); trialsOf.get(g.handle).push(a); }
  }
  const selectedSweep = route.view === "sweep" ? route.handle : (sweepOf.get(route.handle) || {}).handle;
  const narrowed = Boolean(f.state || f.scheduler || /\b(state|sched|scheduler):/.test(f.q || ""));
  const out = [];
  for (const g of snap.sweeps || []) {  // a sweep still starting (no trial yet) comes first
    if (trialsOf.has(g.handle) || TERMINAL_SWEEP.has(g.state) || narrowed || f.sweep === "none") continue;
    if ((!f.sweep || f.sweep === g.handle) && matchesText({ name: g.name, handle: g.handle, state: "", scheduler: "" },
      f.q)) out.push({ kind: "sweep", sweep: g, trials: [], open: false, depth: 0 });
  }
  const placed = new Set();
  for (const a of snap.apps) {
    const g = sweepOf.get(a.handle);
    if (!g) { if (matches(a, f, sweepOf)) out.push({ kind: "app", app: a, depth: 0 }); continue; }
    if (placed.has(g.handle)) continue;
    placed.add(g.handle);
    const trials = trialsOf.get(g.handle);
    const shown = trials.filter((t) => matches(t, f, sweepOf));
    if (!shown.length) continue;
    const open = g.handle === selectedSweep || f.sweep === g.handle;
    out.push({ kind: "sweep", sweep: g, trials, open, depth: 0 });
    if (open) {
      for (const t of shown) out.push({ kind: "app", app: t, depth: 1 });
    }
  }
  return out;
}

function newRow(kind, handle) {
  const tr = el("tr", null, kind);
  tr.dataset[kind === "app" ? "handle" : "sweep"] = handle;
  for (const cls of ["state", "name", "scheduler", "age", "duration"]) tr.append(el("td", null, cls));
  const link = el("a", null, "open");
  const sub = el("div", null, "sub");
  const err = el("div", null, "err");
  tr.children[1].append(link, sub, err);
  tr.parts = { link, sub, err, badge: null };
  // a click anywhere on the row follows its link (the link itself is what the keyboard reaches)
  tr.addEventListener("click", (ev) => { if (ev.target !== link) link.click(); });
  return tr;
}

function setBadge(tr, state) {
  if (tr.parts.badge && tr.parts.badge.textContent === state) return;
  tr.parts.badge = badge(state);
  tr.children[0].replaceChildren(tr.parts.badge);
}

function fillApp(tr, a, depth, filters) {
  setBadge(tr, a.state);
  setText(tr.parts.link, (depth ? "└ " : "") + a.name);
  setText(tr.parts.sub, a.handle);
  setText(tr.parts.err, a.last_error);
  tr.parts.err.hidden = !a.last_error;
  const href = appLink(filters, a.handle);
  if (tr.parts.link.getAttribute("href") !== href) tr.parts.link.setAttribute("href", href);
  setText(tr.children[2], a.scheduler);
  setText(tr.children[3], fmtDur(a.age));
  setText(tr.children[4], fmtDur(a.duration));
  tr.classList.toggle("trial", depth > 0);
}

function fillSweep(tr, r, filters, taken) {
  const g = r.sweep;
  setBadge(tr, g.state);
  setText(tr.parts.link, (r.open ? "▾ " : "▸ ") + g.name);
  setText(tr.parts.sub, "sweep · " + g.summary);
  setText(tr.parts.err, g.last_error);   // as tsm top's line: why it failed, none once it succeeded
  tr.parts.err.hidden = !g.last_error;
  const href = sweepLink(filters, g.handle);
  if (tr.parts.link.getAttribute("href") !== href) tr.parts.link.setAttribute("href", href);
  setText(tr.children[2], [...new Set(r.trials.map((t) => t.scheduler))].sort().join(","));
  setText(tr.children[3], g.created ? fmtDur(Math.max(taken - g.created, 0)) : "");
  setText(tr.children[4], fmtDur(g.duration));
}

export function renderList(snap, route) {
  const f = route.filters;
  const shown = foldRows(snap, f, route);
  const live = new Set();
  const trs = [];
  order = [];
  for (const r of shown) {
    const handle = r.kind === "app" ? r.app.handle : r.sweep.handle;
    const key = r.kind + ":" + handle;
    live.add(key);
    let tr = rows.get(key);
    if (!tr) { tr = newRow(r.kind, handle); rows.set(key, tr); }
    if (r.kind === "app") fillApp(tr, r.app, r.depth, f);
    else fillSweep(tr, r, f, snap.taken);
    const selected = route.view === r.kind && route.handle === handle;
    tr.classList.toggle("selected", selected);
    if (selected) tr.setAttribute("aria-current", "true"); else tr.removeAttribute("aria-current");
    trs.push(tr);
    order.push({ view: r.kind, handle });
  }
  for (const k of [...rows.keys()]) if (!live.has(k)) rows.delete(k);
  placeRows($("#apps tbody"), trs);
  const empty = $("#list-empty");
  empty.hidden = trs.length > 0;
  if (!trs.length) {
    setText(empty, snap.apps.length ? "No app passes these filters." :
      "No apps yet. Launch one (tsm run …) and it shows here at once.");
  }
  renderFilterOptions(snap, f);
}

// The row after (+1) or before (-1) the one the route shows, as a route; null at either end.
export function neighbour(route, step) {
  if (!order.length) return null;
  const at = order.findIndex((o) => o.view === route.view && o.handle === route.handle);
  const next = at < 0 ? (step > 0 ? 0 : order.length - 1) : at + step;
  return next >= 0 && next < order.length ? order[next] : null;
}

export function scrollToSelected() {
  const tr = $("#apps tbody tr.selected");
  if (tr) tr.scrollIntoView({ block: "nearest" });
}

// -- the filter selects: their options follow what the snapshot holds ------------------------------------
function setOptions(select, pairs, current) {
  const want = [["", select.options[0].textContent], ...pairs];
  if (current && !want.some(([v]) => v === current)) want.push([current, current]);
  const have = [...select.options].map((o) => o.value + "\u0000" + o.textContent).join("\n");
  if (have !== want.map(([v, t]) => v + "\u0000" + t).join("\n")) {
    select.replaceChildren(...want.map(([v, t]) => { const o = el("option", t); o.value = v; return o; }));
  }
  if (select.value !== current) select.value = current;
}

const STATES = ["RUNNING", "PENDING", "SUBMITTED", "FAILED", "SUCCEEDED", "CANCELLED"];

function renderFilterOptions(snap, f) {
  const scheds = [...new Set(snap.apps.map((a) => a.scheduler))].sort();
  setOptions($("#f-scheduler"), scheds.map((s) => [s, s]), f.scheduler);
  const states = [...new Set([...STATES.filter((s) => snap.apps.some((a) => a.state === s)),
    ...snap.apps.map((a) => a.state)])];
  setOptions($("#f-state"), states.map((s) => [s, s.toLowerCase()]), f.state);
  const sweeps = (snap.sweeps || []).map((g) => [g.handle, g.name + " · " + g.handle.split("/").pop()]);
  setOptions($("#f-sweep"), sweeps.length ? [["none", "not in a sweep"], ...sweeps] : [], f.sweep);
}

// The detail pane of one app: its title and facts, why it failed (the reason, the failed replica and its
// last lines) at the top, its replicas, their usage over time, and the picked replica's log.
import { $, api, badge, el, fmtDur, num, placeRows, setText, TERMINAL, usedReq } from "./dom.js";
import { PALETTE, usageCharts } from "./charts.js";
import { followLog } from "./logs.js";
import { appLink } from "./route.js";

const FAILURE_LINES = 20;
const SAMPLE_EVERY_MS = 3000;

let shownHandle = null;
let replicaRows = new Map();   // "role/idx" -> <tr> of the app shown
let samples = { handle: null, at: 0, data: {}, ended: false, inflight: false };
let failure = { key: null };

export function replicaKey(r) {
  return r.role + "/" + r.idx;
}

// The replica the pane shows: the route's, else the one that failed, else the first.
export function pickedReplica(app, route) {
  if (!app.replicas.length) return null;
  if (route.role !== null) {
    const r = app.replicas.find((x) => x.role === route.role && x.idx === route.k);
    if (r) return r;
  }
  return failedReplica(app) || app.replicas[0];
}

export function failedReplica(app) {
  return app.replicas.find((r) => r.state === "FAILED")
    || app.replicas.find((r) => r.exit_code !== null && r.exit_code !== 0 && r.state !== "CANCELLED") || null;
}

// A time as the clock shows it, with the day when it is not today.
function when(t) {
  if (!t) return "";
  const d = new Date(t * 1000);
  const time = d.toTimeString().slice(0, 8);
  return d.toDateString() === new Date().toDateString() ? time : d.toISOString().slice(0, 10) + " " + time;
}

function meta(app) {
  const facts = [["handle", app.handle], ["scheduler", app.scheduler],
    ["submitted", when(app.created)],
    ["age", fmtDur(app.age)], ["ran", fmtDur(app.duration)], ["restarts", app.restarts],
    ["replicas", app.replicas.length]];
  const dl = $("#detail-meta");
  if (dl.children.length !== facts.length) {
    dl.replaceChildren(...facts.map(([k]) => { const d = el("div", null, "fact"); d.append(el("dt", k), el("dd")); return d; }));
  }
  facts.forEach(([, v], i) => setText(dl.children[i].lastChild, v));
}

function replicaRow(i) {
  const tr = el("tr", null, "replica");
  for (const cls of ["id", "state", "host", "attempt", "exit", "cpu", "mem", "gpu", "line"]) {
    tr.append(el("td", null, cls));
  }
  const swatch = el("span", null, "swatch");
  swatch.style.background = PALETTE[i % PALETTE.length];   // the colour of its line in the charts
  const link = el("a");
  tr.children[0].append(swatch, link);
  tr.parts = { link };
  tr.addEventListener("click", (ev) => { if (ev.target !== link) link.click(); });
  return tr;
}

function renderReplicas(app, picked, filters) {
  if (shownHandle !== app.handle) replicaRows = new Map();
  const trs = app.replicas.map((r, i) => {
    const key = replicaKey(r);
    let tr = replicaRows.get(key);
    if (!tr) { tr = replicaRow(i); replicaRows.set(key, tr); }
    tr.dataset.replica = key;
    setText(tr.parts.link, key);
    const href = appLink(filters, app.handle, r.role, r.idx);
    if (tr.parts.link.getAttribute("href") !== href) tr.parts.link.setAttribute("href", href);
    const td = tr.children;
    [null, r.state, r.host, r.attempt, r.exit_code, usedReq(r.cpu_used, r.cpu_req, 2),
      usedReq(r.mem_used_mb, r.mem_req_mb, 0), r.gpu_mem_mb === null && !r.gpu_req ? "n/a" :
        num(r.gpu_mem_mb, 0) + " / " + (r.gpu_req === null ? "–" : r.gpu_req), r.error || r.last_line]
      .forEach((v, j) => { if (j) setText(td[j], v); });
    td[1].className = "state state-" + r.state;
    td[8].classList.toggle("err", Boolean(r.error));
    const mine = picked && key === replicaKey(picked);
    tr.classList.toggle("selected", Boolean(mine));
    return tr;
  });
  placeRows($("#replicas tbody"), trs);
  $("#replicas").parentElement.hidden = !trs.length;
  $("#no-replicas").hidden = trs.length > 0;
  const select = $("#log-replica");
  const keys = app.replicas.map(replicaKey);
  if ([...select.options].map((o) => o.value).join("\n") !== keys.join("\n")) {
    select.replaceChildren(...keys.map((k) => { const o = el("option", k); o.value = k; return o; }));
  }
  if (picked) select.value = replicaKey(picked);
}

// -- why it failed ---------------------------------------------------------------------------------------
async function loadFailureLines(app, r, key) {
  const url = api(app.handle, "/logs") + "?role=" + encodeURIComponent(r.role) + "&k=" + r.idx
    + "&tail=" + FAILURE_LINES;
  let text;
  try {
    const resp = await fetch(url);
    const body = await resp.json();
    text = resp.ok ? body.lines.join("\n") : "its log cannot be read: " + (body.error || resp.status);
  } catch (e) {
    text = "its log cannot be read: " + e;
  }
  if (failure.key !== key) return;
  const pre = $("#failure-lines");
  setText(pre, text || "(it wrote nothing)");
  pre.scrollTop = pre.scrollHeight;   // the last line (most often the error) in sight
}

function renderFailure(app, filters) {
  const r = failedReplica(app);
  const failed = app.state === "FAILED" || r !== null;
  $("#failure").hidden = !failed;
  if (!failed) { failure = { key: null }; return; }
  setText($("#failure-reason"), app.last_error || (r && r.error) || "no reason was reported");
  $("#failure-lines").hidden = !r;
  $("#failure-open").hidden = !r;
  if (!r) { setText($("#failure-replica"), ""); failure = { key: null }; return; }
  const facts = [r.exit_code !== null ? "exit code " + r.exit_code : r.state.toLowerCase()];
  if (r.host) facts.push("on " + r.host);
  if (r.attempt) facts.push("attempt " + (r.attempt + 1));
  if (r.error && !(app.last_error || "").includes(r.error)) facts.push(r.error);
  setText($("#failure-replica"), "replica " + replicaKey(r) + ": " + facts.join(" · ") + " · its last lines:");
  $("#failure-open").setAttribute("href", appLink(filters, app.handle, r.role, r.idx));
  const key = [app.handle, replicaKey(r), r.attempt, r.state, app.state].join("\u0000");
  if (failure.key !== key) {
    failure = { key };
    setText($("#failure-lines"), "…");
    loadFailureLines(app, r, key);
  }
}

// -- usage over time -------------------------------------------------------------------------------------
async function loadSamples(app, picked) {
  samples.inflight = true;
  try {
    const resp = await fetch(api(app.handle, "/samples"));
    if (resp.ok && samples.handle === app.handle) {
      samples.data = await resp.json();
      samples.ended = TERMINAL.has(app.state);
    }
  } finally {
    samples.inflight = false;
  }
  if (samples.handle === app.handle) drawCharts(app, picked);
}

let drawn = null;   // [app, picked] of the charts last drawn, to draw them again at a new width

export function redrawCharts() {
  if (drawn && !$("#detail").hidden) drawCharts(...drawn);
}

function drawCharts(app, picked) {
  drawn = [app, picked];
  const box = $("#charts");
  const { points } = usageCharts(box, samples.data, app.replicas, picked ? replicaKey(picked) : null);
  box.hidden = points === 0;
  setText($("#charts-note"), points ? "" : TERMINAL.has(app.state)
    ? "No usage samples: tsm serve samples replicas while they run, where their usage can be measured."
    : "No usage samples yet: tsm serve samples running replicas every few seconds.");
}

function renderUsage(app, picked, changed) {
  if (samples.handle !== app.handle) samples = { handle: app.handle, at: 0, data: {}, ended: false, inflight: false };
  const due = !samples.ended && Date.now() - samples.at > SAMPLE_EVERY_MS;
  if (!samples.inflight && (due || samples.at === 0)) {
    samples.at = Date.now();
    loadSamples(app, picked);
  } else if (changed) {
    drawCharts(app, picked);
  }
}

// -- the whole pane --------------------------------------------------------------------------------------
let lastPicked = null;

export function renderApp(snap, app, route) {
  const picked = pickedReplica(app, route);
  const title = $("#detail-title");
  if (title.dataset.state !== app.state || title.dataset.name !== app.name) {
    title.replaceChildren(el("span", app.name, "name"), badge(app.state));
    title.dataset.state = app.state;
    title.dataset.name = app.name;
  }
  $("#cancel").hidden = TERMINAL.has(app.state);
  meta(app);
  renderFailure(app, route.filters);
  renderReplicas(app, picked, route.filters);
  const pickedKey = picked ? app.handle + " " + replicaKey(picked) : null;
  renderUsage(app, picked, pickedKey !== lastPicked || shownHandle !== app.handle);
  lastPicked = pickedKey;
  shownHandle = app.handle;
  $("#replica-pane").hidden = !picked;
  if (picked) followLog(app.handle, picked.role, picked.idx);
}

export function forgetApp() {
  shownHandle = null;
  drawn = null;
  lastPicked = null;
  samples = { handle: null, at: 0, data: {}, ended: false, inflight: false };
  failure = { key: null };
}

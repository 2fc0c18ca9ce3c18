// tsm serve: the dashboard page. Plain JavaScript, no build step. Everything a user or an app wrote
// (names, errors, log lines) is put on the page with textContent, never parsed as HTML.
"use strict";

const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
let snapshot = null;       // the latest snapshot from /api/events
let selected = null;       // handle of the app shown in the detail section
let follow = null;         // { es: EventSource, key: "role/k", handle }
let chartTimer = null;

const $ = (sel) => document.querySelector(sel);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function api(handle, suffix) {
  return "api/apps/" + encodeURIComponent(handle) + (suffix || "");
}

function fmtDur(s) {
  if (s === null || s === undefined) return "";
  s = Math.round(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
}

function num(v, digits) {
  return v === null || v === undefined ? "n/a" : Number(v).toFixed(digits);
}

function usedReq(used, req, digits) {
  const r = req === null || req === undefined ? "–" : String(req);
  return num(used, digits) + " / " + r;
}

function matchesFilter(app) {
  const f = $("#filter").value.trim().toLowerCase();
  if (!f) return true;
  return [app.name, app.handle, app.scheduler, app.state].some((s) => String(s).toLowerCase().includes(f));
}

async function cancelApp(app) {
  if (!window.confirm("Cancel " + app.name + " (" + app.handle + ")?")) return;
  const resp = await fetch(api(app.handle, "/cancel"), { method: "POST", headers: { "X-TSM": "1" } });
  const body = await resp.json().catch(() => ({}));
  $("#status").textContent = resp.ok ? app.handle + ": " + body.state : "cancel failed: " + (body.error || resp.status);
}

// Rows are kept per app (and per replica) and only their text is updated, so a row or button the user
// is about to click is the same element after a refresh.
const appRows = new Map();      // handle -> <tr>
let replicaRows = new Map();    // "role/idx" -> <tr>, for the selected app
let replicaRowsOf = null;

function setText(td, value) {
  const text = value === null || value === undefined ? "" : String(value);
  if (td.textContent !== text) td.textContent = text;
}

function placeRows(tbody, rows) {
  rows.forEach((tr, i) => { if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null); });
  while (tbody.children.length > rows.length) tbody.lastChild.remove();
}

function appRow(handle) {
  const tr = el("tr", null, "app");
  tr.dataset.handle = handle;
  for (const cls of ["name", "handle", "scheduler", "state", "age", "duration", "restarts", "err", "actions"]) {
    tr.append(el("td", null, cls));
  }
  tr.cancelButton = el("button", "Cancel", "cancel");
  tr.cancelButton.addEventListener("click", (ev) => { ev.stopPropagation(); cancelApp(tr.app); });
  tr.addEventListener("click", () => select(handle));
  return tr;
}

function renderApps() {
  const rows = [];
  const live = new Set();
  for (const app of snapshot.apps) {
    live.add(app.handle);
    if (!matchesFilter(app)) continue;
    let tr = appRows.get(app.handle);
    if (!tr) { tr = appRow(app.handle); appRows.set(app.handle, tr); }
    tr.app = app;
    const td = tr.children;
    [app.name, app.handle, app.scheduler, app.state, fmtDur(app.age), fmtDur(app.duration), app.restarts,
      app.last_error].forEach((v, i) => setText(td[i], v));
    td[3].className = "state state-" + app.state;
    tr.classList.toggle("selected", app.handle === selected);
    const terminal = TERMINAL.has(app.state);
    if (terminal && tr.cancelButton.isConnected) tr.cancelButton.remove();
    if (!terminal && !tr.cancelButton.isConnected) td[8].append(tr.cancelButton);
    rows.push(tr);
  }
  for (const h of [...appRows.keys()]) if (!live.has(h)) appRows.delete(h);
  placeRows($("#apps tbody"), rows);
}

function replicaRow(handle, r) {
  const tr = el("tr", null, "replica");
  tr.dataset.replica = r.role + "/" + r.idx;
  for (const cls of ["id", "state", "host", "attempt", "exit", "cpu", "mem", "gpu", "err", "line", "actions"]) {
    tr.append(el("td", null, cls));
  }
  const b = el("button", "Logs", "logs");
  b.addEventListener("click", () => followLog(handle, r.role, r.idx));
  tr.children[10].append(b);
  return tr;
}

function renderDetail() {
  const app = snapshot && selected ? snapshot.apps.find((a) => a.handle === selected) : null;
  $("#detail").hidden = !app;
  if (!app) return;
  setText($("#detail-title"), app.name + " — " + app.state);
  if (replicaRowsOf !== app.handle) { replicaRows = new Map(); replicaRowsOf = app.handle; }
  const rows = [];
  for (const r of app.replicas) {
    const key = r.role + "/" + r.idx;
    let tr = replicaRows.get(key);
    if (!tr) { tr = replicaRow(app.handle, r); replicaRows.set(key, tr); }
    const td = tr.children;
    [key, r.state, r.host, r.attempt, r.exit_code, usedReq(r.cpu_used, r.cpu_req, 2),
      usedReq(r.mem_used_mb, r.mem_req_mb, 0), usedReq(r.gpu_mem_mb, r.gpu_req, 0), r.error, r.last_line]
      .forEach((v, i) => setText(td[i], v));
    td[1].className = "state state-" + r.state;
    rows.push(tr);
  }
  placeRows($("#replicas tbody"), rows);
  if (app.replicas.length && (!follow || follow.handle !== app.handle)) {
    followLog(app.handle, app.replicas[0].role, app.replicas[0].idx);
  }
}

function render() {
  renderApps();
  renderDetail();
}

function select(handle) {
  selected = handle;
  render();
  drawCharts();
  if (chartTimer) clearInterval(chartTimer);
  chartTimer = setInterval(drawCharts, 5000);
}

// -- logs ---------------------------------------------------------------------------------------
function lineMatches(text) {
  const q = $("#log-search").value.trim();
  return !q || text.toLowerCase().includes(q.toLowerCase());
}

function applySearch() {
  const q = $("#log-search").value.trim();
  let hits = 0;
  for (const div of $("#log").children) {
    const ok = lineMatches(div.textContent);
    div.hidden = !ok;
    div.classList.toggle("hit", Boolean(q) && ok);
    if (ok) hits += 1;
  }
  $("#log-count").textContent = q ? hits + " matching lines" : $("#log").children.length + " lines";
}

function followLog(handle, role, k) {
  if (follow) follow.es.close();
  const log = $("#log");
  log.replaceChildren();
  const key = role + "/" + k;
  $("#log-title").textContent = "log of " + key + " (following)";
  const es = new EventSource(api(handle, "/logs/follow") + "?role=" + encodeURIComponent(role) + "&k=" + k);
  follow = { es, key, handle };
  applySearch();
  es.onmessage = (ev) => {
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    const div = el("div", JSON.parse(ev.data), "logline");
    if (!lineMatches(div.textContent)) div.hidden = true;
    log.append(div);
    if (atEnd) log.scrollTop = log.scrollHeight;
    applySearch();
  };
  es.addEventListener("end", (ev) => {
    const why = JSON.parse(ev.data);
    $("#log-title").textContent = "log of " + key + " (ended" + (why ? ": " + why : "") + ")";
    es.close();
  });
}

// -- charts -------------------------------------------------------------------------------------
function drawSeries(canvas, points, index, label, color) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  const vals = points.filter((p) => p[index] !== null);
  ctx.fillStyle = "#555";
  ctx.font = "11px sans-serif";
  if (vals.length === 0) { ctx.fillText(label + ": no samples yet", 4, 14); return; }
  const t0 = vals[0][0], t1 = Math.max(vals[vals.length - 1][0], t0 + 1);
  const max = Math.max(...vals.map((p) => p[index]), 1e-9) * 1.1;
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  vals.forEach((p, i) => {
    const x = (p[0] - t0) / (t1 - t0) * (w - 8) + 4;
    const y = h - 4 - p[index] / max * (h - 20);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
  ctx.fillText(label + " (max " + (max / 1.1).toFixed(2) + ", " + fmtDur(t1 - t0) + ")", 4, 12);
}

async function drawCharts() {
  if (!selected) return;
  const handle = selected;
  const resp = await fetch(api(handle, "/samples"));
  if (!resp.ok || handle !== selected) return;
  const data = await resp.json();
  const box = $("#charts");
  box.replaceChildren();
  for (const key of Object.keys(data).sort()) {
    const fig = el("figure");
    fig.dataset.replica = key;
    const cpu = el("canvas"), mem = el("canvas");
    cpu.width = mem.width = 320;
    cpu.height = mem.height = 90;
    drawSeries(cpu, data[key], 1, "CPU cores", "#1565c0");
    drawSeries(mem, data[key], 2, "memory MiB", "#2e7d32");
    fig.append(el("figcaption", key), cpu, mem);
    if (data[key].some((p) => p[3] !== null)) {
      const gpu = el("canvas");
      gpu.width = 320; gpu.height = 90;
      drawSeries(gpu, data[key], 3, "GPU MiB", "#6a1b9a");
      fig.append(gpu);
    }
    box.append(fig);
  }
}

// -- sweeps: one link each to its page (sweep.html) --------------------------------------------
function renderSweeps() {
  const groups = (snapshot && snapshot.sweeps) || [];
  $("#sweeps").hidden = groups.length === 0;
  $("#sweeps ul").replaceChildren(...groups.map((g) => {
    const li = el("li");
    const a = el("a", g.name);
    a.href = "sweep?id=" + encodeURIComponent(g.handle);
    li.dataset.sweep = g.handle;
    li.append(a, el("span", " " + g.state + " (" + g.summary + ") " + g.handle, "muted"));
    return li;
  }));
}

// -- live updates -------------------------------------------------------------------------------
function connect() {
  const es = new EventSource("api/events");
  es.onopen = () => { $("#status").textContent = "live"; };
  es.onmessage = (ev) => {
    snapshot = JSON.parse(ev.data);
    const errs = Object.entries(snapshot.errors || {}).map(([k, v]) => k + ": " + v);
    $("#status").textContent = "live · " + snapshot.apps.length + " apps" + (errs.length ? " · " + errs.join("; ") : "");
    render();
    renderSweeps();
  };
  es.onerror = () => { $("#status").textContent = "disconnected, retrying…"; };
}

$("#filter").addEventListener("input", () => { if (snapshot) renderApps(); });
$("#log-search").addEventListener("input", applySearch);
connect();

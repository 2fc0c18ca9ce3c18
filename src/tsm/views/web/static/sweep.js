// tsm serve: a sweep's page. Its trials table and a scatter of a chosen metric against each parameter,
// fetched from /api/sweeps/{id} again whenever a refresh (/api/events) shows the sweep's counts changed.
// Everything a trial or a user wrote (parameters, metrics, messages) goes on the page with textContent.
"use strict";

const sweepId = new URLSearchParams(location.search).get("id") || "";
let data = null;       // the latest /api/sweeps/{id}
let lastSummary = null;
let chosen = null;     // the metric the user picked

const $ = (sel) => document.querySelector(sel);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function fmtDur(s) {
  if (s === null || s === undefined) return "";
  s = Math.round(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
}

// A metric as a number (trackers may keep "0.25" as text), else null.
function asNum(v) {
  if (typeof v === "number") return Number.isFinite(v) ? v : null;
  if (typeof v === "string" && v.trim() !== "" && Number.isFinite(Number(v))) return Number(v);
  return null;
}

function cell(v) {
  if (v === null || v === undefined) return "";
  return typeof v === "number" ? String(Number(v.toPrecision(6))) : String(v);
}

async function load() {
  const resp = await fetch("api/sweeps/" + encodeURIComponent(sweepId));
  if (!resp.ok) {
    $("#status").textContent = resp.status === 404 ? "unknown sweep " + sweepId : "error " + resp.status;
    return;
  }
  data = await resp.json();
  render();
}

function render() {
  const s = data.sweep;
  $("#sweep-title").textContent = s.name + " · " + s.handle;
  $("#summary").textContent = s.summary + " · " + s.scheduler + ", at most " + s.parallel + " at once";
  const select = $("#metric");
  const want = chosen || (data.metrics.includes(s.metric) ? s.metric : data.metrics[0]) || null;
  if ([...select.options].map((o) => o.value).join("\n") !== data.metrics.join("\n")) {
    select.replaceChildren(...data.metrics.map((m) => { const o = el("option", m); o.value = m; return o; }));
  }
  if (want) select.value = want;
  renderTable();
  drawScatter(select.value || null);
}

function renderTable() {
  const head = $("#trials thead tr");
  const cols = ["Trial", ...data.axes, "State", "Duration", ...data.metrics, "Handle", "Message"];
  head.replaceChildren(...cols.map((c) => el("th", c)));
  const body = $("#trials tbody");
  body.replaceChildren(...data.trials.map((t) => {
    const tr = el("tr");
    tr.dataset.trial = String(t.trial);
    tr.append(el("td", t.trial));
    for (const a of data.axes) tr.append(el("td", t.params[a]));
    tr.append(el("td", t.state, "state-" + t.state), el("td", fmtDur(t.duration)));
    for (const m of data.metrics) tr.append(el("td", cell(t.metrics[m])));
    tr.append(el("td", t.handle || "", "line"), el("td", t.msg || "", "err"));
    return tr;
  }));
}

// One canvas per parameter: the metric (y) against the parameter's value (x). A numeric parameter is
// placed by value (log-scaled when it spans more than two decades), any other by its values in order.
function drawScatter(metric) {
  const box = $("#scatter");
  box.replaceChildren();
  if (!metric) { $("#chart-note").textContent = "no trial has recorded a metric yet"; return; }
  const pts = data.trials.filter((t) => asNum(t.metrics[metric]) !== null);
  $("#chart-note").textContent = pts.length + " of " + data.trials.length + " trials recorded " + metric;
  for (const axis of data.axes) {
    const fig = el("figure");
    fig.dataset.axis = axis;
    const canvas = el("canvas");
    canvas.width = 320; canvas.height = 220;
    canvas.dataset.points = String(pts.length);
    fig.append(el("figcaption", metric + " against " + axis), canvas);
    box.append(fig);
    plot(canvas, pts.map((t) => [t.params[axis], asNum(t.metrics[metric])]), axis, metric);
  }
}

function plot(canvas, pairs, xLabel, yLabel) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 34;
  ctx.font = "11px sans-serif";
  ctx.fillStyle = "#555";
  ctx.strokeStyle = "#bbb";
  ctx.strokeRect(pad, 4, w - pad - 4, h - pad - 4);
  if (pairs.length === 0) { ctx.fillText("no values yet", pad + 6, 20); return; }
  const numeric = pairs.every((p) => p[0] !== "" && !isNaN(Number(p[0])));
  let xs;
  let ticks = [];
  if (numeric) {
    const raw = pairs.map((p) => Number(p[0]));
    const lo = Math.min(...raw), hi = Math.max(...raw);
    const log = lo > 0 && hi / lo > 100;
    const f = log ? Math.log10 : (v) => v;
    const a = f(lo), b = f(hi) === f(lo) ? f(lo) + 1 : f(hi);
    xs = raw.map((v) => (f(v) - a) / (b - a));
    ticks = [[0, cell(lo)], [1, cell(hi)]];
  } else {
    const levels = [...new Set(pairs.map((p) => String(p[0])))].sort();
    const n = Math.max(levels.length - 1, 1);
    xs = pairs.map((p) => levels.indexOf(String(p[0])) / n);
    ticks = levels.map((l, i) => [i / n, l]);
  }
  const ys = pairs.map((p) => p[1]);
  const ylo = Math.min(...ys), yhi = Math.max(...ys) === ylo ? ylo + 1 : Math.max(...ys);
  const X = (u) => pad + 8 + u * (w - pad - 20);
  const Y = (v) => h - pad - 8 - (v - ylo) / (yhi - ylo) * (h - pad - 20);
  ctx.fillStyle = "#1565c0";
  pairs.forEach((p, i) => { ctx.beginPath(); ctx.arc(X(xs[i]), Y(ys[i]), 3.5, 0, 2 * Math.PI); ctx.fill(); });
  ctx.fillStyle = "#555";
  for (const [u, label] of ticks) ctx.fillText(label.slice(0, 12), X(u) - 10, h - pad + 14);
  ctx.fillText(xLabel.slice(0, 30), w / 2 - 20, h - 4);
  ctx.fillText(cell(yhi), 2, 14);
  ctx.fillText(cell(ylo), 2, h - pad - 6);
}

function connect() {
  const es = new EventSource("api/events");
  es.onopen = () => { $("#status").textContent = "live"; };
  es.onmessage = (ev) => {
    const snap = JSON.parse(ev.data);
    const mine = (snap.sweeps || []).find((g) => g.handle === sweepId);
    const summary = mine ? mine.state + " " + mine.summary : null;
    if (summary !== lastSummary || data === null) {   // a trial started or ended: read the table again
      lastSummary = summary;
      load();
    }
  };
  es.onerror = () => { $("#status").textContent = "disconnected, retrying…"; };
}

$("#metric").addEventListener("change", () => { chosen = $("#metric").value; if (data) drawScatter(chosen); });
connect();

// The detail pane of a sweep: its summary, a chosen metric against each parameter, and its trials (each a
// link to the trial's app). Read from api/sweeps/{id} again whenever a refresh shows the sweep's counts
// changed. Parameters and metrics are shown as text, whatever a trial wrote.
import { $, badge, el, fmtDur } from "./dom.js";
import { cell, scatter } from "./charts.js";
import { appLink } from "./route.js";

let shown = { handle: null, summary: null, data: null, chosen: null, loading: false };

// A metric as a number (trackers may keep "0.25" as text), else null.
function asNum(v) {
  if (typeof v === "number") return Number.isFinite(v) ? v : null;
  if (typeof v === "string" && v.trim() !== "" && Number.isFinite(Number(v))) return Number(v);
  return null;
}

async function load(handle, filters) {
  shown.loading = true;
  try {
    const resp = await fetch("api/sweeps/" + encodeURIComponent(handle));
    if (shown.handle !== handle) return;
    if (!resp.ok) {
      $("#sweep-summary").textContent = resp.status === 404 ? "unknown sweep " + handle : "error " + resp.status;
      return;
    }
    shown.data = await resp.json();
    draw(filters);
  } finally {
    shown.loading = false;
  }
}

function draw(filters) {
  const data = shown.data;
  const s = data.sweep;
  $("#sweep-title").replaceChildren(el("span", s.name, "name"), badge(s.state));
  $("#sweep-summary").textContent = s.summary + " · " + s.scheduler + ", at most " + s.parallel + " at once · "
    + s.handle;
  const select = $("#metric");
  if ([...select.options].map((o) => o.value).join("\n") !== data.metrics.join("\n")) {
    select.replaceChildren(...data.metrics.map((m) => { const o = el("option", m); o.value = m; return o; }));
  }
  const want = shown.chosen || (data.metrics.includes(s.metric) ? s.metric : data.metrics[0]) || "";
  if (want) select.value = want;
  select.hidden = !data.metrics.length;
  trialsTable(data, filters);
  drawScatter(select.value || null);
}

function trialsTable(data, filters) {
  const cols = ["Trial", ...data.axes, "State", "Ran", ...data.metrics, "Message"];
  $("#trials thead tr").replaceChildren(...cols.map((c) => el("th", c)));
  $("#trials tbody").replaceChildren(...data.trials.map((t) => {
    const tr = el("tr", null, "trial");
    tr.dataset.trial = String(t.trial);
    const first = el("td");
    if (t.handle) {
      const a = el("a", "#" + t.trial);
      a.href = appLink(filters, t.handle);
      first.append(a);
    } else {
      first.textContent = "#" + t.trial;
    }
    tr.append(first);
    for (const a of data.axes) tr.append(el("td", t.params[a]));
    tr.append(el("td", t.state, "state state-" + t.state), el("td", fmtDur(t.duration)));
    for (const m of data.metrics) tr.append(el("td", cell(t.metrics[m])));
    tr.append(el("td", t.msg || "", "err"));
    return tr;
  }));
}

function drawScatter(metric) {
  const data = shown.data;
  const box = $("#scatter");
  if (!metric) {
    box.replaceChildren();
    $("#chart-note").textContent = "no trial has recorded a metric yet";
    return;
  }
  const pts = data.trials.filter((t) => asNum(t.metrics[metric]) !== null);
  $("#chart-note").textContent = pts.length + " of " + data.trials.length + " trials recorded " + metric;
  const figs = data.axes.map((axis) => {
    const fig = el("figure");
    fig.dataset.axis = axis;
    const canvas = el("canvas");
    canvas.dataset.points = String(pts.length);
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", metric + " against " + axis);
    fig.append(el("figcaption", metric + " against " + axis), canvas);
    return [fig, canvas, axis];
  });
  box.replaceChildren(...figs.map(([f]) => f));
  for (const [, canvas, axis] of figs) scatter(canvas, pts.map((t) => [t.params[axis], asNum(t.metrics[metric])]), axis);
}

// Show the sweep `handle` (from the snapshot's line for it, `group`, when it has one).
export function renderSweep(group, handle, filters) {
  if (shown.handle !== handle) {
    shown = { handle, summary: null, data: null, chosen: null, loading: false };
    $("#sweep-title").replaceChildren(el("span", group ? group.name : handle, "name"));
    $("#sweep-summary").textContent = "loading…";
    $("#trials tbody").replaceChildren();
    $("#scatter").replaceChildren();
  }
  const summary = group ? group.state + " " + group.summary : "";
  if ((summary !== shown.summary || shown.data === null) && !shown.loading) {
    shown.summary = summary;
    load(handle, filters);
  }
}

export function initSweepPane() {
  $("#metric").addEventListener("change", () => {
    shown.chosen = $("#metric").value;
    if (shown.data) drawScatter(shown.chosen);
  });
}

export function forgetSweep() {
  shown = { handle: null, summary: null, data: null, chosen: null, loading: false };
}

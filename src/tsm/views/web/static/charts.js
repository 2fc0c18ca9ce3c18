// Canvas charts, drawn by hand (no library): each replica's CPU, memory and GPU memory over time, and a
// sweep's metric against each parameter.
import { el } from "./dom.js";

export const PALETTE = ["#1565c0", "#2e7d32", "#c62828", "#6a1b9a", "#ef6c00", "#00838f", "#ad1457", "#4e342e",
  "#283593", "#558b2f"];
const INK = "#455a64", GRID = "#e0e6ea";

// A canvas as wide as its box, sharp on high-density screens; returns its 2D context in CSS pixels.
function sized(canvas, height) {
  const ratio = window.devicePixelRatio || 1;
  const width = Math.max(200, Math.floor(canvas.parentElement.clientWidth || 320));
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  canvas.style.width = width + "px";
  canvas.style.height = height + "px";
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.font = "11px system-ui, sans-serif";
  return { ctx, w: width, h: height };
}

function clock(t) {
  return new Date(t * 1000).toTimeString().slice(0, 8);
}

function tick(v) {
  return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
}

// One metric (`index` into the samples' points) of every replica: a line each, `selected` drawn on top and
// thicker, its request (`req`) as a dashed line.
function drawUsage(canvas, data, keys, index, selected, req) {
  const { ctx, w, h } = sized(canvas, 118);
  const pad = { l: 40, r: 8, t: 8, b: 18 };
  const series = keys.map((k) => (data[k] || []).filter((p) => p[index] !== null && p[index] !== undefined));
  const all = series.flat();
  ctx.fillStyle = INK;
  if (!all.length) { ctx.fillText("no samples yet", pad.l, 20); return 0; }
  const t0 = Math.min(...all.map((p) => p[0]));
  const t1 = Math.max(Math.max(...all.map((p) => p[0])), t0 + 1);
  const top = Math.max(...all.map((p) => p[index]), req || 0, 1e-6) * 1.12;
  const X = (t) => pad.l + (t - t0) / (t1 - t0) * (w - pad.l - pad.r);
  const Y = (v) => h - pad.b - v / top * (h - pad.t - pad.b);
  ctx.strokeStyle = GRID;
  ctx.lineWidth = 1;
  for (const f of [0, 0.5, 1]) {
    ctx.beginPath(); ctx.moveTo(pad.l, Y(top / 1.12 * f)); ctx.lineTo(w - pad.r, Y(top / 1.12 * f)); ctx.stroke();
    ctx.fillText(tick(top / 1.12 * f), 2, Y(top / 1.12 * f) + 4);
  }
  ctx.fillText(clock(t0), pad.l, h - 4);
  ctx.textAlign = "right";
  ctx.fillText(clock(t1), w - pad.r, h - 4);
  ctx.textAlign = "left";
  if (req) {
    ctx.setLineDash([4, 3]);
    ctx.strokeStyle = PALETTE[keys.indexOf(selected) % PALETTE.length] || INK;
    ctx.beginPath(); ctx.moveTo(pad.l, Y(req)); ctx.lineTo(w - pad.r, Y(req)); ctx.stroke();
    ctx.setLineDash([]);
  }
  const drawOrder = keys.map((k, i) => i).sort((a, b) => (keys[a] === selected) - (keys[b] === selected));
  for (const i of drawOrder) {
    const pts = series[i];
    if (!pts.length) continue;
    const mine = keys[i] === selected;
    ctx.strokeStyle = PALETTE[i % PALETTE.length];
    ctx.globalAlpha = selected && !mine ? 0.45 : 1;
    ctx.lineWidth = mine ? 2.5 : 1.5;
    ctx.beginPath();
    pts.forEach((p, j) => { if (j === 0) ctx.moveTo(X(p[0]), Y(p[index])); else ctx.lineTo(X(p[0]), Y(p[index])); });
    if (pts.length === 1) ctx.arc(X(pts[0][0]), Y(pts[0][index]), 2, 0, 2 * Math.PI);
    ctx.stroke();
  }
  ctx.globalAlpha = 1;
  return all.length;
}

const METRICS = [
  { key: "cpu", index: 1, label: "CPU (cores)", req: "cpu_req" },
  { key: "mem", index: 2, label: "memory (MiB)", req: "mem_req_mb" },
  { key: "gpu", index: 3, label: "GPU memory (MiB)", req: null },
];

// The usage charts of an app into `box`: one figure per metric (GPU only where measured), a line per replica.
// `replicas` are the app's replicas (for their requests), `selected` the "role/idx" picked.
export function usageCharts(box, data, replicas, selected) {
  const keys = [...new Set([...replicas.map((r) => r.role + "/" + r.idx), ...Object.keys(data)])];
  const sel = replicas.find((r) => r.role + "/" + r.idx === selected);
  const figures = [];
  for (const m of METRICS) {
    if (m.key === "gpu" && !keys.some((k) => (data[k] || []).some((p) => p[3] !== null))) continue;
    const fig = el("figure");
    fig.dataset.metric = m.key;
    const canvas = el("canvas");
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", m.label + " of each replica over time");
    fig.append(el("figcaption", m.label), canvas);
    figures.push([fig, canvas, m]);
  }
  box.replaceChildren(...figures.map(([fig]) => fig));
  if (!replicas.length && keys.length) box.append(legend(keys));  // no replica table to carry the colours
  let points = 0;
  for (const [fig, canvas, m] of figures) {
    const n = drawUsage(canvas, data, keys, m.index, selected, sel && m.req ? sel[m.req] : null);
    fig.dataset.points = String(n);
    points += n;
  }
  return { keys, points };
}

function legend(keys) {
  const p = el("p", null, "legend");
  keys.forEach((k, i) => {
    const swatch = el("span", null, "swatch");
    swatch.style.background = PALETTE[i % PALETTE.length];
    p.append(swatch, el("span", k + " "));
  });
  return p;
}

// -- a sweep: its metric (y) against one parameter (x) --------------------------------------------------
export function cell(v) {
  if (v === null || v === undefined) return "";
  return typeof v === "number" ? String(Number(v.toPrecision(6))) : String(v);
}

// A numeric parameter is placed by value (log-scaled when it spans more than two decades), any other by its
// values in order.
export function scatter(canvas, pairs, xLabel) {
  const { ctx, w, h } = sized(canvas, 200);
  const pad = 34;
  ctx.fillStyle = INK;
  ctx.strokeStyle = GRID;
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
  ctx.fillStyle = PALETTE[0];
  pairs.forEach((p, i) => { ctx.beginPath(); ctx.arc(X(xs[i]), Y(ys[i]), 3.5, 0, 2 * Math.PI); ctx.fill(); });
  ctx.fillStyle = INK;
  for (const [u, label] of ticks) {
    ctx.textAlign = u <= 0 ? "left" : u >= 1 ? "right" : "center";
    ctx.fillText(label.slice(0, 12), X(u) + (u <= 0 ? -4 : u >= 1 ? 4 : 0), h - pad + 14);
  }
  ctx.textAlign = "center";
  ctx.fillText(xLabel.slice(0, 30), w / 2, h - 4);
  ctx.textAlign = "left";
  ctx.fillText(cell(yhi), 2, 14);
  ctx.fillText(cell(ylo), 2, h - pad - 6);
}

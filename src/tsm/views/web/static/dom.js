// Small helpers shared by the page's modules. Text always goes in through textContent: a name, an error or
// a log line is shown as written, never parsed as HTML.

export const $ = (sel, root) => (root || document).querySelector(sel);

export function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

// Set a node's text only when it changed (no relayout for an unchanged cell).
export function setText(node, value) {
  const text = value === null || value === undefined ? "" : String(value);
  if (node.textContent !== text) node.textContent = text;
}

// Put `rows` in `tbody` in that order, moving only what moved; rows not given are removed.
export function placeRows(tbody, rows) {
  rows.forEach((tr, i) => { if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null); });
  while (tbody.children.length > rows.length) tbody.lastChild.remove();
}

export function fmtDur(s) {
  if (s === null || s === undefined) return "";
  s = Math.round(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
  return Math.floor(s / 86400) + "d" + String(Math.floor(s % 86400 / 3600)).padStart(2, "0") + "h";
}

export function num(v, digits) {
  return v === null || v === undefined ? "n/a" : Number(v).toFixed(digits);
}

export function usedReq(used, req, digits) {
  return num(used, digits) + " / " + (req === null || req === undefined ? "–" : String(req));
}

export const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

export function api(handle, suffix) {
  return "api/apps/" + encodeURIComponent(handle) + (suffix || "");
}

// The state word as a badge: <span class="badge state-FAILED">FAILED</span>.
export function badge(state) {
  return el("span", state, "badge state-" + state);
}

// The log pane: one replica's log followed live over server-sent events (api/apps/{id}/logs/follow), a
// search that hides the lines without the words, and "follow" that keeps the pane at its end (scrolling up
// turns it off, scrolling back to the end turns it on again). At most MAX_LINES lines are kept on the page.
import { $, api, el } from "./dom.js";

const MAX_LINES = 5000;
let current = null;   // { es, handle, key }
let dropped = 0;

export function following() {
  return current;
}

function query() {
  return $("#log-search").value.trim().toLowerCase();
}

function atEnd(log) {
  return log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
}

function count() {
  const q = query();
  const log = $("#log");
  const total = log.children.length;
  let text;
  if (q) {
    let hits = 0;
    for (const div of log.children) if (!div.hidden) hits += 1;
    text = hits + " matching lines";
  } else {
    text = total + " lines" + (dropped ? " (" + dropped + " older ones dropped)" : "");
  }
  $("#log-count").textContent = text;
}

export function applySearch() {
  const q = query();
  for (const div of $("#log").children) {
    const ok = !q || div.textContent.toLowerCase().includes(q);
    div.hidden = !ok;
    div.classList.toggle("hit", Boolean(q) && ok);
  }
  count();
  if ($("#log-follow").checked) scrollEnd();
}

export function scrollEnd() {
  const log = $("#log");
  log.scrollTop = log.scrollHeight;
}

let countTimer = null;
function countSoon() {   // many lines at once: count once per frame, not once per line
  if (countTimer === null) countTimer = requestAnimationFrame(() => { countTimer = null; count(); });
}

function append(text) {
  const log = $("#log");
  const div = el("div", text, "logline");
  const q = query();
  if (q) {
    const ok = text.toLowerCase().includes(q);
    div.hidden = !ok;
    div.classList.toggle("hit", ok);
  }
  log.append(div);
  while (log.children.length > MAX_LINES) { log.firstChild.remove(); dropped += 1; }
  if ($("#log-follow").checked) scrollEnd();
  countSoon();
}

// Follow `role`/`k` of `handle` (nothing happens when it is the one followed already).
export function followLog(handle, role, k) {
  const key = role + "/" + k;
  if (current && current.handle === handle && current.key === key) return;
  stopLog();
  $("#log").replaceChildren();
  dropped = 0;
  $("#log-title").textContent = "following " + key;
  const es = new EventSource(api(handle, "/logs/follow") + "?role=" + encodeURIComponent(role) + "&k=" + k);
  current = { es, handle, key };
  count();
  es.onmessage = (ev) => append(JSON.parse(ev.data));
  es.addEventListener("end", (ev) => {
    const why = JSON.parse(ev.data);
    $("#log-title").textContent = key + " ended" + (why ? ": " + why : "");
    es.close();
    count();
  });
  es.onerror = () => {
    if (es.readyState === EventSource.CLOSED) $("#log-title").textContent = key + ": the log stream closed";
  };
}

export function stopLog() {
  if (current) current.es.close();
  current = null;
}

export function initLogPane() {
  $("#log-search").addEventListener("input", applySearch);
  const log = $("#log");
  log.addEventListener("scroll", () => {
    const box = $("#log-follow");
    const end = atEnd(log);
    if (box.checked !== end) box.checked = end;
  });
  $("#log-follow").addEventListener("change", () => { if ($("#log-follow").checked) scrollEnd(); });
}

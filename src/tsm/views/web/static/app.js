// tsm serve: the dashboard page. Plain JavaScript modules, no build step and nothing downloaded. The list of
// apps (list.js) and the selected app (detail.js) or sweep (sweep.js) side by side; what is shown lives in
// the URL's fragment (route.js). Everything a user or an app wrote (names, errors, log lines) is put on the
// page with textContent, never parsed as HTML.
import { $, api, TERMINAL } from "./dom.js";
import { forgetApp, pickedReplica, redrawCharts, renderApp, replicaKey } from "./detail.js";
import { neighbour, renderList, scrollToSelected } from "./list.js";
import { initLogPane, scrollEnd, stopLog } from "./logs.js";
import { FILTERS, format, parse } from "./route.js";
import { initStackPane } from "./stack.js";
import { forgetSweep, initSweepPane, renderSweep } from "./sweep.js";

let snapshot = null;
let route = parse(location.hash);

// Opened as /?token=T (the server set the cookie) or /sweep?id=S: keep the address shareable, without the token.
function tidyAddress() {
  const params = new URLSearchParams(location.search);
  let hash = location.hash;
  if (location.pathname.endsWith("/sweep") && params.get("id")) {
    hash = format({ view: "sweep", handle: params.get("id"), filters: {} });
  }
  if (location.search || hash !== location.hash) {
    const dir = location.pathname.replace(/sweep$/, "");
    history.replaceState(null, "", dir + (hash || "#/"));
    route = parse(location.hash);
  }
}

function go(next, replace) {
  const hash = format(next);
  if (replace) history.replaceState(null, "", hash); else history.pushState(null, "", hash);
  route = parse(location.hash);
  render();
  scrollToSelected();
}

function showDetail(which) {
  $("#nothing").hidden = which !== "nothing";
  $("#detail").hidden = which !== "app";
  $("#sweep").hidden = which !== "sweep";
}

function render() {
  document.body.dataset.view = route.view;
  for (const f of FILTERS) {
    const input = f === "q" ? $("#filter") : $("#f-" + f);
    if (input.value !== route.filters[f] && document.activeElement !== input) input.value = route.filters[f];
  }
  $("#back").setAttribute("href", format({ view: "list", filters: route.filters }));
  if (!snapshot) return;
  renderList(snapshot, route);
  if (route.view === "app") {
    const app = snapshot.apps.find((a) => a.handle === route.handle || a.app_id === route.handle);
    if (app) {
      showDetail("app");
      renderApp(snapshot, app, route);
      document.title = app.name + " · tsm";
      return;
    }
    showDetail("nothing");
    $("#nothing").firstElementChild.textContent = "No app " + route.handle + " among the "
      + snapshot.apps.length + " newest apps.";
  } else if (route.view === "sweep") {
    stopLog();
    forgetApp();
    showDetail("sweep");
    renderSweep((snapshot.sweeps || []).find((g) => g.handle === route.handle), route.handle, route.filters);
    document.title = "sweep · tsm";
    return;
  } else {
    showDetail("nothing");
    $("#nothing").firstElementChild.textContent = "Select an app or a sweep on the left.";
  }
  stopLog();
  forgetApp();
  forgetSweep();
  document.title = "tsm";
}

// -- live updates ----------------------------------------------------------------------------------------
function connect() {
  const es = new EventSource("api/events");
  es.onopen = () => { document.body.classList.remove("offline"); $("#status").textContent = "live"; };
  es.onmessage = (ev) => {
    const first = snapshot === null;
    snapshot = JSON.parse(ev.data);
    const errs = Object.entries(snapshot.errors || {}).map(([k, v]) => k + ": " + v);
    $("#status").textContent = "live · " + snapshot.apps.length + " apps" + (errs.length ? " · " + errs.join("; ") : "");
    $("#status").classList.toggle("warn", errs.length > 0);
    render();
    if (first) scrollToSelected();
  };
  es.onerror = () => {
    document.body.classList.add("offline");
    $("#status").textContent = "disconnected, retrying…";
  };
}

// -- filters ---------------------------------------------------------------------------------------------
function initFilters() {
  const set = (f, value) => go({ ...route, filters: { ...route.filters, [f]: value } }, true);
  $("#filter").addEventListener("input", () => set("q", $("#filter").value));
  for (const f of ["scheduler", "state", "sweep"]) {
    $("#f-" + f).addEventListener("change", () => set(f, $("#f-" + f).value));
  }
}

// -- cancel, with a confirmation in the page ---------------------------------------------------------------
function selectedApp() {
  return snapshot && route.view === "app" ? snapshot.apps.find((a) => a.handle === route.handle) : null;
}

function askCancel() {
  const app = selectedApp();
  if (!app || TERMINAL.has(app.state)) return;
  const dialog = $("#confirm");
  $("#confirm-text").textContent = "Cancel " + app.name + " (" + app.handle + ")? Its replicas are stopped.";
  dialog.dataset.handle = app.handle;
  dialog.showModal();
  $("#confirm-no").focus();
}

async function cancelApp(handle) {
  $("#status").textContent = "cancelling " + handle + "…";
  const resp = await fetch(api(handle, "/cancel"), { method: "POST", headers: { "X-TSM": "1" } });
  const body = await resp.json().catch(() => ({}));
  $("#status").textContent = resp.ok ? handle + ": " + body.state : "cancel failed: " + (body.error || resp.status);
}

function initDialogs() {
  const confirm = $("#confirm");
  $("#cancel").addEventListener("click", askCancel);
  $("#confirm-no").addEventListener("click", () => confirm.close("no"));
  $("#confirm-yes").addEventListener("click", () => confirm.close("yes"));
  confirm.addEventListener("close", () => {
    if (confirm.returnValue === "yes") cancelApp(confirm.dataset.handle);
    confirm.returnValue = "";
  });
  $("#help-open").addEventListener("click", () => $("#help").showModal());
  $("#help-close").addEventListener("click", () => $("#help").close());
  $("#log-replica").addEventListener("change", () => {
    const [role, k] = splitKey($("#log-replica").value);
    go({ ...route, view: "app", role, k }, false);
  });
}

function splitKey(key) {
  const at = key.lastIndexOf("/");
  return [key.slice(0, at), Number(key.slice(at + 1))];
}

// -- keys ------------------------------------------------------------------------------------------------
function stepReplica(step) {
  const app = selectedApp();
  if (!app || !app.replicas.length) return;
  const keys = app.replicas.map(replicaKey);
  const picked = pickedReplica(app, route);
  const at = Math.min(Math.max(keys.indexOf(replicaKey(picked)) + step, 0), keys.length - 1);
  const [role, k] = splitKey(keys[at]);
  go({ ...route, role, k }, true);
}

const KEYS = {
  "/": () => $("#filter").focus(),
  j: () => step(1), ArrowDown: () => step(1),
  k: () => step(-1), ArrowUp: () => step(-1),
  "]": () => stepReplica(1), "[": () => stepReplica(-1),
  s: () => { if (!$("#detail").hidden) $("#log-search").focus(); },
  f: () => { const b = $("#log-follow"); b.checked = !b.checked; if (b.checked) scrollEnd(); },
  c: askCancel,
  "?": () => $("#help").showModal(),
  Escape: () => { if (route.view !== "list") go({ view: "list", filters: route.filters }, false); },
};

function step(by) {
  const next = neighbour(route, by);
  if (!next) return;
  go({ view: next.view, handle: next.handle, role: null, k: null, filters: route.filters }, true);
  const link = document.querySelector("#apps tbody tr.selected a.open");
  if (link) link.focus({ preventScroll: true });   // where Tab and Enter carry on from
}

function onKey(ev) {
  if (ev.ctrlKey || ev.metaKey || ev.altKey || document.querySelector("dialog[open]")) return;
  const t = ev.target;
  const typing = t instanceof HTMLInputElement || t instanceof HTMLSelectElement || t instanceof HTMLTextAreaElement;
  if (typing) {
    if (ev.key === "Escape" || (ev.key === "Enter" && t.id === "filter")) { t.blur(); ev.preventDefault(); }
    return;
  }
  if ((ev.key === "ArrowDown" || ev.key === "ArrowUp") && t.id === "log") return;  // scrolling the log
  const act = KEYS[ev.key];
  if (act) { ev.preventDefault(); act(); }
}

let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(redrawCharts, 150);
});
window.addEventListener("hashchange", () => { route = parse(location.hash); render(); scrollToSelected(); });
document.addEventListener("keydown", onKey);
tidyAddress();
initFilters();
initDialogs();
initLogPane();
initSweepPane();
initStackPane(() => {
  const app = selectedApp();
  const picked = app && pickedReplica(app, route);
  return picked ? { handle: app.handle, role: picked.role } : null;
});
render();
connect();

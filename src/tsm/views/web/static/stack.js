// The Stack tab: every Python thread's stack of the selected replica's role (GET api/apps/{id}/stack, py-spy on
// the server's side), replicas with the same stacks folded and the one that differs marked. Only read: the
// server never runs a command for the page. Text goes in through textContent, as everywhere.

import { $, api } from "./dom.js";

let target = () => null;   // () => { handle, role } of the selected replica, or null
let taking = false;

function show(stack) {
  $("#tab-log").setAttribute("aria-selected", String(!stack));
  $("#tab-stack").setAttribute("aria-selected", String(stack));
  $("#logbar").hidden = stack;
  $("#log").hidden = stack;
  $("#stackbar").hidden = !stack;
  $("#stack").hidden = !stack;
}

export function showingStack() {
  return $("#tab-stack").getAttribute("aria-selected") === "true";
}

export async function takeStack() {
  const t = target();
  if (!t || taking) return;
  taking = true;
  $("#stack-title").textContent = "taking the stacks of " + t.role + "…";
  try {
    const resp = await fetch(api(t.handle, "/stack") + "?role=" + encodeURIComponent(t.role), { headers: { "X-TSM": "1" } });
    const body = await resp.json().catch(() => ({}));
    if (!resp.ok) {
      $("#stack").textContent = "";
      $("#stack-title").textContent = "no stacks: " + (body.error || resp.status);
      return;
    }
    $("#stack").textContent = body.text + (body.errors.length ? "\n" + body.errors.join("\n") + "\n" : "");
    const n = body.replicas.length;
    $("#stack-title").textContent = t.role + ": " + n + " replica" + (n === 1 ? "" : "s") + ", " + body.groups.length +
      " group" + (body.groups.length === 1 ? "" : "s") + ", taken " + new Date().toLocaleTimeString();
  } finally {
    taking = false;
  }
}

export function initStackPane(current) {
  target = current;
  $("#tab-stack").hidden = false;
  $("#tab-log").addEventListener("click", () => show(false));
  $("#tab-stack").addEventListener("click", () => { show(true); takeStack(); });
  $("#stack-again").addEventListener("click", takeStack);
}

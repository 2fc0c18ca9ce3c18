// What the page shows lives in the URL's fragment, so each view has a link to share and the back button
// returns to the previous one:
//   #/                                   the list only
//   #/app/<handle>                       an app (its first replica's log)
//   #/app/<handle>/<role>/<k>            an app with that replica's log and charts picked
//   #/sweep/<handle>                     a sweep: its trials, a metric against each parameter
// followed by the list's filters, if any: ?q=words&state=FAILED&scheduler=local&sweep=<sweep handle>.
// Each part is URL-encoded (a handle's "://" and "/" too).

export const FILTERS = ["q", "state", "scheduler", "sweep"];

export function parse(hash) {
  const raw = (hash || "").replace(/^#/, "");
  const [path, query] = [raw.split("?")[0], raw.split("?").slice(1).join("?")];
  const parts = path.split("/").filter((p) => p !== "").map((p) => {
    try { return decodeURIComponent(p); } catch (e) { return p; }
  });
  const params = new URLSearchParams(query);
  const filters = {};
  for (const f of FILTERS) filters[f] = params.get(f) || "";
  const route = { view: "list", handle: "", role: null, k: null, filters };
  if (parts[0] === "app" && parts[1]) {
    Object.assign(route, { view: "app", handle: parts[1] });
    if (parts.length >= 4 && /^\d+$/.test(parts[3])) Object.assign(route, { role: parts[2], k: Number(parts[3]) });
  } else if (parts[0] === "sweep" && parts[1]) {
    Object.assign(route, { view: "sweep", handle: parts[1] });
  }
  return route;
}

export function format(route) {
  let path = "#/";
  if (route.view === "app" && route.handle) {
    path += "app/" + encodeURIComponent(route.handle);
    if (route.role !== null && route.role !== undefined && route.k !== null && route.k !== undefined) {
      path += "/" + encodeURIComponent(route.role) + "/" + route.k;
    }
  } else if (route.view === "sweep" && route.handle) {
    path += "sweep/" + encodeURIComponent(route.handle);
  }
  const params = new URLSearchParams();
  for (const f of FILTERS) if (route.filters && route.filters[f]) params.set(f, route.filters[f]);
  const qs = params.toString();
  return qs ? path + "?" + qs : path;
}

// The link to an app (or one of its replicas) keeping the current filters.
export function appLink(filters, handle, role, k) {
  return format({ view: "app", handle, role: role === undefined ? null : role, k: k === undefined ? null : k,
    filters });
}

export function sweepLink(filters, handle) {
  return format({ view: "sweep", handle, filters });
}

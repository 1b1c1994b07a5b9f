// The dashboard page (dashboard_http.h): plain HTML, CSS and JavaScript, no build step. Data is
// put into the page with textContent only (never parsed as HTML).
#include "head/dashboard_http.h"

namespace torus {

const std::string& DashboardPage() {
  static const std::string page = R"PAGE(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Torus dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>
body{font:14px system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d232b}
header{background:#1d3557;color:#fff;padding:10px 18px;display:flex;align-items:center;gap:18px}
header h1{font-size:18px;margin:0} header span{opacity:.8}
main{padding:14px 18px;display:grid;gap:14px}
section{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:10px 14px}
h2{font-size:15px;margin:2px 0 8px}
table{border-collapse:collapse;width:100%} th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #eef0f3;vertical-align:top}
th{color:#55606e;font-weight:600} tr.click{cursor:pointer} tr.click:hover{background:#eef4ff}
.state-FAILED,.state-DEAD,.state-broken{color:#b42318;font-weight:600}
.state-RUNNING,.state-ALIVE,.state-CREATED,.state-reserved{color:#1a7f37}
.state-PENDING,.state-PENDING_ARGS,.state-RESCHEDULING,.state-RESTARTING{color:#9a6700}
.pager{display:flex;gap:8px;align-items:center;margin-top:6px}
#log{background:#0d1117;color:#d6deeb;font:12px ui-monospace,monospace;white-space:pre-wrap;max-height:360px;overflow:auto;padding:8px;border-radius:4px;min-height:60px}
#login{max-width:420px;margin:80px auto}
#login input{width:100%;padding:6px;margin:6px 0;font:inherit;box-sizing:border-box}
.kv{display:flex;flex-wrap:wrap;gap:6px 22px} .kv div b{display:block;font-size:20px}
.err{color:#b42318}
</style></head>
<body>
<div id="login" hidden><section><h2>Sign in to this Torus cluster</h2>
<form id="login-form"><label for="token">Cluster token (the <code>token</code> file of the head's session)</label>
<input id="token" name="token" type="password" autocomplete="off" required>
<button type="submit">Sign in</button> <span id="login-error" class="err"></span></form></section></div>
<div id="app" hidden>
<header><h1>Torus</h1><span id="summary"></span><span style="flex:1"></span><button id="logout">Sign out</button></header>
<main>
<section><h2>Cluster</h2><div class="kv" id="overview"></div></section>
<section><h2>TPU slices</h2><table id="slices"><thead><tr><th>Slice</th><th>Type</th><th>Topology</th><th>Hosts</th><th>State</th><th>Holder</th></tr></thead><tbody></tbody></table></section>
<section><h2>Jobs</h2><table id="jobs"><thead><tr><th>Job</th><th>Status</th><th>Entrypoint</th><th>Slice</th><th>Message</th></tr></thead><tbody></tbody></table>
<h2 id="log-title">Log</h2><div id="log">Select a job to follow its log.</div></section>
<section><h2>Nodes</h2><input id="node-filter" placeholder="filter: id, host or label"> <table id="nodes"><thead><tr><th>Node</th><th>Host</th><th>Alive</th><th>Resources (available / total)</th><th>Labels</th></tr></thead><tbody></tbody></table><div class="pager" id="nodes-pager"></div></section>
<section><h2>Placement groups</h2><table id="pgs"><thead><tr><th>Group</th><th>Name</th><th>Strategy</th><th>State</th><th>Bundles</th><th>Slices</th><th>Why pending</th></tr></thead><tbody></tbody></table><div class="pager" id="pgs-pager"></div></section>
<section><h2>Actors</h2><table id="actors"><thead><tr><th>Actor</th><th>Class</th><th>Name</th><th>State</th><th>Node</th><th>Restarts</th><th>Death cause</th></tr></thead><tbody></tbody></table><div class="pager" id="actors-pager"></div></section>
<section><h2>Recent tasks</h2><label><input type="checkbox" id="failed-only"> failures only</label><table id="tasks"><thead><tr><th>Task</th><th>Name</th><th>State</th><th>Attempt</th><th>Error</th></tr></thead><tbody></tbody></table></section>
</main></div>
<script>
"use strict";
const PAGE = 50;
const pages = {nodes: 0, pgs: 0, actors: 0};
let followed = null, socket = null, timer = null;

async function api(path) {
  const r = await fetch(path, {credentials: "same-origin"});
  if (r.status === 401 || r.status === 403) { showLogin(); throw new Error("signed out"); }
  if (!r.ok) throw new Error(path + ": " + r.status + " " + await r.text());
  return r.json();
}
function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "" : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}
function fill(id, rows, render) {
  const body = document.querySelector("#" + id + " tbody");
  const fresh = document.createElement("tbody");
  for (const row of rows) { const tr = document.createElement("tr"); render(tr, row); fresh.appendChild(tr); }
  body.replaceWith(fresh);
}
function resources(avail, total) {
  return Object.keys(total).sort().map(k => k + " " + fmt(avail[k] ?? 0) + "/" + fmt(total[k])).join(", ");
}
function fmt(v) { return v >= 1e9 ? (v / 2 ** 30).toFixed(1) + "Gi" : String(Math.round(v * 100) / 100); }
function pager(id, total) {
  const el = document.getElementById(id + "-pager");
  el.textContent = "";
  const first = pages[id] * PAGE;
  const info = document.createElement("span");
  info.textContent = total === 0 ? "none" : (first + 1) + "–" + Math.min(first + PAGE, total) + " of " + total;
  const prev = document.createElement("button"), next = document.createElement("button");
  prev.textContent = "‹ previous"; next.textContent = "next ›";
  prev.disabled = pages[id] === 0; next.disabled = first + PAGE >= total;
  prev.onclick = () => { pages[id]--; refresh(); };
  next.onclick = () => { pages[id]++; refresh(); };
  el.append(prev, info, next);
}

async function refresh() {
  try {
    const o = await api("/api/dashboard/overview");
    document.getElementById("summary").textContent = o.nodes_alive + " nodes alive";
    const ov = document.getElementById("overview");
    ov.textContent = "";
    const add = (label, value) => { const d = document.createElement("div"); const b = document.createElement("b");
      b.textContent = value; d.append(b, label); ov.appendChild(d); };
    add("nodes alive", o.nodes_alive); add("nodes dead", o.nodes_dead); add("drivers", o.drivers);
    for (const k of Object.keys(o.resources_total).sort()) add(k + " free / total", fmt(o.resources_available[k] ?? 0) + " / " + fmt(o.resources_total[k]));
    const [slices, jobs, nodes, pgs, actors, tasks] = await Promise.all([
      api("/api/dashboard/slices"), api("/api/jobs/"),
      api("/api/dashboard/nodes?limit=" + PAGE + "&offset=" + pages.nodes * PAGE + "&q=" + encodeURIComponent(document.getElementById("node-filter").value)),
      api("/api/dashboard/placement_groups?limit=" + PAGE + "&offset=" + pages.pgs * PAGE),
      api("/api/dashboard/actors?limit=" + PAGE + "&offset=" + pages.actors * PAGE),
      api("/api/dashboard/tasks?limit=100" + (document.getElementById("failed-only").checked ? "&failed=1" : ""))]);
    fill("slices", slices.rows, (tr, s) => { cell(tr, s.name); cell(tr, s.pod_type); cell(tr, s.topology);
      cell(tr, s.hosts_alive + "/" + s.hosts_expected); cell(tr, s.state, "state-" + s.state); cell(tr, s.holder); });
    fill("jobs", jobs.slice().reverse().slice(0, 200), (tr, j) => {
      tr.className = "click"; tr.dataset.job = j.submission_id; tr.onclick = () => follow(j.submission_id);
      cell(tr, j.submission_id); cell(tr, j.status, "state-" + j.status); cell(tr, j.entrypoint);
      cell(tr, j.torus && j.torus.slice ? j.torus.slice.accelerator + " " + j.torus.slice.topology : ""); cell(tr, j.message); });
    fill("nodes", nodes.rows, (tr, n) => { cell(tr, n.node_id.slice(0, 12)); cell(tr, n.hostname); cell(tr, n.alive ? "yes" : "no", n.alive ? "" : "state-DEAD");
      cell(tr, resources(n.available, n.total)); cell(tr, Object.entries(n.labels).map(([k, v]) => k + "=" + v).join(" ")); });
    pager("nodes", nodes.total);
    fill("pgs", pgs.rows, (tr, g) => { cell(tr, g.pg_id.slice(0, 12)); cell(tr, g.name); cell(tr, g.strategy); cell(tr, g.state, "state-" + g.state);
      cell(tr, g.bundles); cell(tr, g.slice ? g.slice.slice_names.join(" ") : ""); cell(tr, g.pending_reason); });
    pager("pgs", pgs.total);
    fill("actors", actors.rows, (tr, a) => { cell(tr, a.actor_id.slice(0, 12)); cell(tr, a.class_name); cell(tr, a.name); cell(tr, a.state, "state-" + a.state);
      cell(tr, a.node_id.slice(0, 12)); cell(tr, a.restarts); cell(tr, a.death_cause); });
    pager("actors", actors.total);
    fill("tasks", tasks.rows, (tr, t) => { cell(tr, t.task_id.slice(-12)); cell(tr, t.name); cell(tr, t.state, "state-" + t.state); cell(tr, t.attempt); cell(tr, t.error); });
  } catch (e) {
    if (e.message !== "signed out") document.getElementById("summary").textContent = "refresh failed: " + e.message;
  }
}

function follow(id) {
  if (socket) socket.close();
  followed = id;
  const log = document.getElementById("log");
  log.textContent = "";
  document.getElementById("log-title").textContent = "Log of " + id;
  socket = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/api/jobs/" + encodeURIComponent(id) + "/logs/tail");
  socket.onmessage = ev => { if (followed === id) { log.append(ev.data); log.scrollTop = log.scrollHeight; } };
  socket.onclose = () => { if (followed === id) document.getElementById("log-title").textContent = "Log of " + id + " (ended)"; };
}

function showLogin() {
  clearInterval(timer); timer = null;
  document.getElementById("app").hidden = true;
  document.getElementById("login").hidden = false;
}
function showApp() {
  document.getElementById("login").hidden = true;
  document.getElementById("app").hidden = false;
  refresh();
  if (!timer) timer = setInterval(refresh, 2000);
}
document.getElementById("login-form").onsubmit = async ev => {
  ev.preventDefault();
  const r = await fetch("/api/authenticate", {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({token: document.getElementById("token").value.trim()})});
  if (r.ok) { document.getElementById("login-error").textContent = ""; showApp(); }
  else document.getElementById("login-error").textContent = r.status === 403 ? "That is not this cluster's token." : "Sign-in failed (" + r.status + ").";
};
document.getElementById("logout").onclick = async () => { await fetch("/api/logout", {method: "POST"}); showLogin(); };
document.getElementById("node-filter").oninput = () => { pages.nodes = 0; refresh(); };
document.getElementById("failed-only").onchange = () => refresh();
fetch("/api/dashboard/session", {credentials: "same-origin"}).then(r => r.json()).then(s => s.signed_in ? showApp() : showLogin(), showLogin);
</script></body></html>
)PAGE";
  return page;
}

}  // namespace torus

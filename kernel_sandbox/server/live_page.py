"""The HTML of the live pages: plain markup, inline CSS and a small inline script.

No CDN and no framework: the pages work on an air-gapped machine and load nothing but
this server's own JSON.  Every fragment shown comes escaped from :mod:`.live_render`.
``{{NONCE}}`` (the CSP's nonce of the page's one script) and ``{{CSRF}}`` (the
session's token, sent with the interrupt) are filled in per response by ``deps.page``.
"""

from __future__ import annotations

__all__ = ["LIST_PAGE", "SESSION_PAGE"]

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d232b}
header{background:#1d2b3a;color:#fff;padding:10px 18px;display:flex;gap:14px;align-items:center}
header a{color:#cfe3ff} main{padding:14px 18px;max-width:1100px}
table{border-collapse:collapse;width:100%;background:#fff}
td,th{border-bottom:1px solid #e3e6ea;padding:6px 8px;text-align:left}
.cell{background:#fff;border:1px solid #e3e6ea;border-radius:6px;margin:10px 0;padding:8px 10px}
.cell.md{background:#fbfcfe}.cell .role{font-size:12px;color:#6a7785;text-transform:uppercase}
.prompt{color:#6a7785;font:12px monospace}
pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;font:13px/1.4 ui-monospace,monospace}
pre.source{background:#f3f5f8;padding:6px;border-radius:4px}
pre.stderr{background:#fff4f4}pre.error{background:#fdecec;color:#8a1c1c}
img.plot{max-width:100%;display:block;margin:6px 0}
iframe.html{width:100%;min-height:120px;border:1px solid #e3e6ea;background:#fff}
.state{padding:2px 8px;border-radius:10px;background:#e3e6ea;color:#1d232b;font-size:12px}
.state.busy{background:#ffe9a8}.state.idle{background:#d8f3dc}.state.ended{background:#e3e6ea}.state.paused{background:#dbe7ff}
button{font:inherit;padding:3px 10px}
.cell.running{border-color:#e0b400;box-shadow:0 0 0 2px #ffe9a8}
"""

LIST_PAGE = (
    """<!doctype html><html><head><meta charset="utf-8"><title>kernel-sandbox: sessions</title>
<style>"""
    + _STYLE
    + """</style></head><body>
<header><b>kernel-sandbox</b><span>sandboxes and sessions</span><span id="owner"></span></header>
<main><h3>Live sandboxes</h3>
<table id="live"><thead><tr><th>id</th><th>owner</th><th>image</th><th>age</th><th>state</th>
<th>cells</th><th>session</th></tr></thead><tbody></tbody></table>
<h3>Finished sessions</h3>
<table id="done"><thead><tr><th>id</th><th>modified</th><th>size</th><th></th></tr></thead>
<tbody></tbody></table></main>
<script nonce="{{NONCE}}">
"use strict";
const esc = s => String(s).replace(/[&<>"']/g, c => "&#" + c.charCodeAt(0) + ";");
const age = s => s < 90 ? Math.round(s) + " s" : s < 5400 ? Math.round(s / 60) + " min"
  : Math.round(s / 3600) + " h";
async function refresh() {
  try {
    const r = await fetch("/ui/list.json", {credentials: "same-origin"});
    if (!r.ok) { document.body.dataset.error = r.status; return; }
    const d = await r.json();
    document.getElementById("owner").textContent = "key " + d.owner;
    document.querySelector("#live tbody").innerHTML = d.sandboxes.map(s =>
      `<tr><td><a href="/ui/s/${esc(s.id)}">${esc(s.id)}</a></td><td>${esc(s.owner)}</td>
       <td>${esc(s.image)}</td><td>${age(s.age_s)}</td>
       <td><span class="state ${esc(s.state)}">${esc(s.state)}</span></td>
       <td>${s.cells}</td><td>${esc(s.status)}</td></tr>`).join("");
    document.querySelector("#done tbody").innerHTML = d.sessions.map(s =>
      `<tr><td><a href="/ui/s/${esc(s.id)}">${esc(s.id)}</a></td><td>${age(s.modified_s)} ago</td>
       <td>${s.size} B</td><td><a href="/ui/s/${esc(s.id)}/notebook.ipynb">.ipynb</a></td></tr>`
    ).join("");
  } finally { setTimeout(refresh, 2000); }
}
refresh();
</script></body></html>"""
)

SESSION_PAGE = (
    """<!doctype html><html><head><meta charset="utf-8"><title>session {{ID}}</title>
<style>"""
    + _STYLE
    + """</style></head><body>
<header><a href="/ui">&larr; all</a><b>session {{ID}}</b>
<span id="state" class="state">loading</span><span id="status"></span><span id="image"></span>
<button id="interrupt">Interrupt</button>
<a href="/ui/s/{{ID}}/notebook.ipynb">download .ipynb</a>
<a href="/ui/s/{{ID}}/notebook.html">download HTML</a></header>
<main id="cells"></main>
<script nonce="{{NONCE}}">
"use strict";
const id = "{{ID}}", csrf = "{{CSRF}}";
const box = document.getElementById("cells");
let version = -2, shown = [];
function show(cells) {
  cells.forEach((html, i) => {
    if (shown[i] === html) return;
    const holder = document.createElement("div");
    holder.innerHTML = html;
    const el = holder.firstElementChild;
    if (i < box.children.length) box.replaceChild(el, box.children[i]); else box.appendChild(el);
    shown[i] = html;
  });
  while (box.children.length > cells.length) box.removeChild(box.lastChild);
  shown.length = cells.length;
  document.body.dataset.cells = String(cells.length);
}
async function poll() {
  let wait = 0;
  try {
    const r = await fetch(`/ui/s/${id}/cells?version=${version}`, {credentials: "same-origin"});
    if (!r.ok) { wait = 2000; document.getElementById("state").textContent = "error " + r.status; }
    else {
      const d = await r.json();
      const atEnd = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
      show(d.cells);
      if (atEnd) window.scrollTo(0, document.body.scrollHeight);
      const st = document.getElementById("state");
      st.textContent = d.state; st.className = "state " + d.state;
      document.getElementById("status").textContent = d.status;
      document.getElementById("image").textContent = d.image || "";
      if (d.version === -1) return;  // a finished session does not grow
      version = d.version;
    }
  } catch (e) { wait = 2000; }
  setTimeout(poll, wait);
}
document.getElementById("interrupt").onclick = async () => {
  await fetch(`/v1/sandboxes/${id}/interrupt`, {method: "POST", credentials: "same-origin",
    headers: {"X-CSRF-Token": csrf}});
};
poll();
</script></body></html>"""
)

// airuntime web console: the little behaviour the server-rendered pages need.
// Copyright the airuntime authors, Apache-2.0 (see LICENSE here). Plain ES module, no library.
// - a run page that is live follows the run's ledger over SSE (GET .../events) and repaints
//   step states from .../state after each burst of entries;
// - [data-fragment] elements (timeline, ledger) are loaded after the page, [data-more]
//   links append the next ledger page;
// - the runs table (first page) refreshes itself every few seconds.

const REPAINT_MS = 250;
const TABLE_MS = 3000;

function stateClass(status) {
  return "st-" + String(status || "unknown").toLowerCase().replaceAll("_", "-");
}

function setState(el, status) {
  for (const c of [...el.classList]) if (c.startsWith("st-")) el.classList.remove(c);
  el.classList.add(stateClass(status));
}

async function loadFragment(el, url, append = false) {
  const resp = await fetch(url, { credentials: "same-origin" });
  const html = await resp.text();
  if (append) el.insertAdjacentHTML("beforeend", html); else el.innerHTML = html;
}

function wireFragments(root) {
  for (const el of root.querySelectorAll("[data-fragment]")) {
    loadFragment(el, el.dataset.fragment).catch(() => { el.textContent = "Could not load."; });
  }
  root.addEventListener("click", (ev) => {
    const more = ev.target.closest("a[data-more]");
    if (!more) return;
    ev.preventDefault();
    const holder = more.parentElement;
    loadFragment(holder, more.href).catch(() => { holder.textContent = "Could not load."; });
  });
}

function repaint(state, body) {
  const badge = document.getElementById("run-status");
  badge.textContent = state.status;
  setState(badge, state.status);
  const progress = document.getElementById("progress");
  if (progress && state.total) progress.textContent = `${state.done} of ${state.total} steps ended`;
  for (const [step, status] of Object.entries(state.steps)) {
    const node = document.querySelector(`#dag [data-node="${CSS.escape(step)}"]`);
    if (node) {
      setState(node, status);
      const title = node.querySelector("title");
      if (title) title.textContent = `${step}: ${status}`;
    }
    const cell = document.querySelector(`[data-step-status="${CSS.escape(step)}"]`);
    if (cell) { cell.textContent = status; setState(cell, status); }
  }
  for (const [node, counts] of Object.entries(state.groups)) {
    const text = document.querySelector(`[data-counts="${CSS.escape(node)}"]`);
    if (text) text.textContent = Object.entries(counts).sort().map(([k, v]) => `${k} ${v}`).join(", ");
  }
  // What the server renders differently (input forms, buttons) needs a fresh page.
  const waiting = state.waiting.join(",");
  const exStatus = state.execution_status || "";
  if (state.terminal || waiting !== body.dataset.waiting || (exStatus !== body.dataset.exstatus
      && ["Paused", "Running"].includes(exStatus))) {
    location.replace(location.pathname + location.search.replace(/([?&])done=[^&]*/, "$1"));
    return true;
  }
  return false;
}

function followRun(body) {
  // One state read at a time: entries arriving while one is in flight ask for one more.
  let timer = null;
  let busy = false;
  let dirty = false;
  let stopped = false;
  const refresh = async () => {
    timer = null;
    busy = true;
    dirty = false;
    try {
      const resp = await fetch(`${location.pathname}/state`, { credentials: "same-origin" });
      if (resp.ok && repaint(await resp.json(), body)) stopped = true;
    } finally {
      busy = false;
      if (dirty) soon();
    }
  };
  const soon = () => {
    if (stopped) return;
    if (busy) { dirty = true; return; }
    if (!timer) timer = setTimeout(refresh, REPAINT_MS);
  };
  const read = async () => {
    // fetch() instead of EventSource: the ledger's events are named by entry type and
    // EventSource has no catch-all listener; the stream is the API's own SSE.
    const resp = await fetch(`${location.pathname}/events`, {
      credentials: "same-origin", headers: { accept: "text/event-stream" },
    });
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      if (buffer.includes("\n\n")) {
        const ended = /(^|\n)event: end\n/.test(buffer);
        buffer = buffer.slice(buffer.lastIndexOf("\n\n") + 2);
        soon();
        if (ended) return;
      }
    }
  };
  const loop = async () => {
    while (!stopped) {
      try { await read(); soon(); return; } catch { await new Promise((r) => setTimeout(r, 2000)); }
    }
  };
  soon();
  loop();
}

function liveTable(holder) {
  const url = new URL(holder.dataset.liveTable, location.origin);
  url.searchParams.set("fragment", "1");
  setInterval(() => {
    if (document.hidden) return;
    loadFragment(holder, url).catch(() => {});
  }, TABLE_MS);
}

const body = document.body;
wireFragments(body);
if (body.dataset.run && body.dataset.live === "1") followRun(body);
const table = document.querySelector("[data-live-table]");
if (table) liveTable(table);

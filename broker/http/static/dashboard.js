// fedbroker dashboard: plain JS, no build step. Every call carries the bearer token as an
// Authorization header; the event stream is read with fetch (EventSource cannot set
// headers), so the token never travels in a URL. Data is rendered as text only.
"use strict";

(() => {
  const KEY = "fedbroker.token";
  const DEBOUNCE_MS = 300; // events come in bursts: one refresh per burst
  const FALLBACK_MS = 30000; // a slow refresh in case the stream misses something
  const MAX_BACKOFF_MS = 30000;
  const MAX_EVENTS = 15;

  const $ = (id) => document.getElementById(id);
  let token = null;
  let stream = null; // AbortController of the event stream
  let timer = null;
  let refreshing = false;
  let again = false;
  let selected = null; // {tenant, name} of the explained job
  const rendered = new Map(); // section -> JSON of what it shows (skip unchanged re-renders)

  // --- DOM helpers (textContent only: data never becomes markup) ------------------------

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("data-") || k.startsWith("aria-") || k === "title" || k === "role"
               || k === "type" || k === "scope") node.setAttribute(k, String(v));
      else node[k] = v;
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function table(headers, rows, label) {
    return h("table", { "aria-label": label },
      h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col", text: t })))),
      h("tbody", {}, rows));
  }

  const fmt = (x) => (Number.isInteger(x) ? String(x) : Number(x).toFixed(2).replace(/\.?0+$/, ""));
  const money = (x) => "$" + Number(x).toFixed(2);

  function changed(section, data) {
    const json = JSON.stringify(data);
    if (rendered.get(section) === json) return false;
    rendered.set(section, json);
    return true;
  }

  // --- API ------------------------------------------------------------------------------

  class AuthError extends Error {}

  async function api(path) {
    const resp = await fetch(path, {
      headers: { Authorization: "Bearer " + token, Accept: "application/json" },
      cache: "no-store",
    });
    if (resp.status === 401) throw new AuthError("the token was refused");
    const body = await resp.json().catch(() => ({}));
    if (!resp.ok) throw new Error(`${path}: ${resp.status} ${body.error || resp.statusText}`);
    return body;
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message || "";
    box.hidden = !message;
  }

  // --- refresh ----------------------------------------------------------------------------

  // body[data-busy]: "true" while a refresh is due or running, so a reader (a test, a
  // screenshot) can wait for the page to show what the API says now.
  function schedule() {
    if (!token) return;
    document.body.dataset.busy = "true";
    clearTimeout(timer);
    timer = setTimeout(() => { timer = null; refresh(); }, DEBOUNCE_MS);
  }

  async function refresh() {
    if (!token) return;
    document.body.dataset.busy = "true";
    if (refreshing) { again = true; return; }
    refreshing = true;
    try {
      const [clusters, nodes, queues, jobs, pools] = await Promise.all([
        api("/v1/clusters"), api("/v1/nodes"), api("/v1/queues"),
        api("/v1/jobs?state=Queued&limit=1000"), api("/v1/pools"),
      ]);
      renderClusters(clusters.clusters, nodes.clusters);
      renderQueues(queues.queues, jobs.items);
      renderPools(pools);
      if (selected) await explain(selected, false);
      $("updated").textContent = "Updated " + new Date().toLocaleTimeString();
      document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
      showError("");
    } catch (err) {
      if (err instanceof AuthError) { logout(err.message); return; }
      showError(String(err.message || err));
    } finally {
      refreshing = false;
      if (again) { again = false; schedule(); }
      if (timer === null && !refreshing) document.body.dataset.busy = "false";
    }
  }

  // --- clusters and their nodes ------------------------------------------------------------

  function nodeCell(node) {
    const total = node.gpus || 0;
    const tags = [node.gpuType || "no GPU"];
    if (node.burst) tags.push("burst node");
    if (!node.schedulable) tags.push("cordoned");
    let title = `${node.name} (${tags.join(", ")}): ${total} GPUs: ${fmt(node.used)} allocated, `
      + `${fmt(node.reserved)} reserved, ${fmt(node.free)} free`;
    if (node.reservedFor.length) title += `; reserved for ${node.reservedFor.join(", ")}`;
    const state = total === 0 ? "empty" : node.free === 0 ? "full"
      : node.free === total ? "idle" : "partial";
    const cell = h("li", {
      class: "node" + (node.burst ? " burst" : "") + (node.schedulable ? "" : " cordoned"),
      title, role: "img", "aria-label": title,
      "data-node": node.name, "data-state": state,
      "data-used": node.used, "data-reserved": node.reserved, "data-free": node.free,
    });
    const scale = total || 1;
    for (const kind of ["used", "reserved", "free"]) {
      const seg = h("span", { class: "seg " + kind, "aria-hidden": "true" });
      seg.style.flexGrow = String(node[kind] / scale);
      cell.append(seg);
    }
    if (node.burst) cell.append(h("span", { class: "mark", "aria-hidden": "true", text: "B" }));
    return cell;
  }

  // A line per declared topology level: each domain's whole free nodes / GPU nodes (as the
  // API lists them, at most 64, the rest counted), then the largest 8-GPU gang inside one.
  function topologyLines(c) {
    const levels = c.topology || [];
    if (!levels.length) return null;
    return h("ul", { class: "topology", "aria-label": `${c.cluster} topology domains` },
      levels.map((lv) => {
        const best = (lv.largestGangs || []).reduce(
          (a, g) => (g.largestGang > (a ? a.largestGang : 0) ? g : a), null);
        const gang = best
          ? `largest ${best.largestGang} x ${lv.gangGpusPerPod} ${best.gpuType} in ${best.domain}`
          : `no ${lv.gangGpusPerPod}-GPU pod fits one ${lv.name}`;
        const parts = lv.domains.map((d, i) => `${d.domain} ${d.freeNodes}/${d.nodes}`
          + (i === 0 ? " free" : ""));
        if (lv.more) parts.push(`+${lv.more} more`);
        const domains = parts.join(", ") || "no domains";
        const unlabelled = lv.unlabelled
          ? `; ${lv.unlabelled} GPU nodes without ${lv.level}` : "";
        const title = `${lv.level}: ${domains}; ${gang}${unlabelled}`;
        return h("li", { "data-level": lv.level, title },
          h("span", { class: "level", text: lv.name }),
          h("span", { class: "domains", text: domains }),
          h("span", { class: "gang", text: gang }));
      }));
  }

  function renderClusters(clusters, nodeRows) {
    if (!changed("clusters", [clusters, nodeRows])) return;
    const byName = new Map(nodeRows.map((c) => [c.cluster, c.nodes]));
    const root = $("clusters");
    root.replaceChildren(...clusters.map((c) => {
      const nodes = byName.get(c.cluster) || [];
      const sum = (k) => c.gpuTypes.reduce((a, t) => a + t[k], 0);
      const bursts = nodes.filter((n) => n.burst).length;
      const heading = h("h3", {}, c.cluster, " ",
        h("span", { class: "badge", text: c.kind }),
        c.stale ? h("span", { class: "badge stale", text: "stale" }) : null);
      const labels = Object.entries(c.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
      const summary = h("p", { class: "summary" },
        `${nodes.length} nodes${bursts ? ` (${bursts} burst)` : ""}, ${sum("total")} GPUs: `
        + `${fmt(sum("allocated"))} allocated, ${fmt(sum("reserved"))} reserved, `
        + `${fmt(sum("free"))} free` + (labels ? ` · ${labels}` : ""));
      // The columns, their words and the gang's "2 x 8" / "none" are those of
      // `fedbroker clusters` (broker/figures.py; tests/http/test_figures.py checks them).
      const totals = c.gpuTypes.length ? table(
        ["GPU", "Total", "Allocated", "Reserved", "Free", "Stranded", "Largest gang"],
        c.gpuTypes.map((t) => h("tr", {},
          h("th", { scope: "row", text: t.gpuType }), h("td", { text: t.total }),
          h("td", { text: fmt(t.allocated) }), h("td", { text: fmt(t.reserved) }),
          h("td", { text: fmt(t.free) }), h("td", { text: fmt(t.stranded || 0) }),
          h("td", { text: t.largestGang > 0 ? `${t.largestGang} x ${t.gangGpusPerPod}` : "none" }))),
        `${c.cluster} GPU totals`) : h("p", { class: "muted", text: "No GPU nodes (yet)." });
      const groups = new Map();
      for (const n of nodes) {
        const key = n.gpuType || "no GPU";
        if (!groups.has(key)) groups.set(key, []);
        groups.get(key).push(n);
      }
      const map = h("div", { class: "groups" }, [...groups.keys()].sort().map((key) => {
        const members = groups.get(key);
        return h("div", { class: "group" },
          h("span", { class: "group-label", text: `${key} ×${members.length}` }),
          h("ul", { class: "heatmap", "aria-label": `${c.cluster} ${key} nodes` },
            members.map(nodeCell)));
      }));
      return h("article", { class: "cluster", "data-cluster": c.cluster,
        "aria-label": `cluster ${c.cluster}` }, heading, summary, map, totals, topologyLines(c));
    }));
  }

  // --- queues, pending jobs, explain ----------------------------------------------------------

  function gpusOf(spec) {
    let total = 0;
    for (const ps of spec.podSets || []) {
      const r = ps.resources || {};
      const whole = Number(r["nvidia.com/gpu"] || 0);
      const milli = Number(r["fedbroker.io/gpu-milli"] || r.gpuMilli || 0);
      total += (ps.count || 1) * (whole + milli / 1000);
    }
    return total;
  }

  function renderQueues(queues, pending) {
    if (changed("queues", queues)) {
      $("queues").replaceChildren(table(
        ["Queue", "Policy", "Pending", "In use (GPUs)"],
        queues.map((q) => h("tr", { "data-queue": q.name },
          h("th", { scope: "row", text: q.name }), h("td", { text: q.policy }),
          h("td", { class: "pending-count", text: q.pending }),
          h("td", { text: Object.entries(q.usage || {}).map(([t, n]) => `${t} ${fmt(n)}`)
            .join(", ") || "0" }))),
        "Queues"));
    }
    const rows = pending.map((j) => ({
      tenant: j.metadata.namespace, name: j.metadata.name, queue: j.status.queue,
      reason: j.status.waiting || j.status.reason || "", gpus: gpusOf(j.spec || {}),
      pods: (j.spec.podSets || []).reduce((a, p) => a + (p.count || 1), 0),
    }));
    if (!changed("pending", rows)) return;
    if (!rows.length) {
      $("pending").replaceChildren(h("p", { class: "muted", text: "Nothing waits." }));
      return;
    }
    $("pending").replaceChildren(h("ul", { class: "pending" }, rows.map((j) => {
      const isSel = selected && selected.tenant === j.tenant && selected.name === j.name;
      return h("li", {}, h("button", {
        type: "button", class: "pending-job", "data-job": j.name, "data-tenant": j.tenant,
        "aria-pressed": isSel ? "true" : "false",
        title: j.reason ? `waits: ${j.reason}` : "waiting",
        onclick: () => { selected = { tenant: j.tenant, name: j.name }; markSelected();
          explain(selected, true); },
      }, h("span", { class: "job-name", text: `${j.tenant}/${j.name}` }),
      h("span", { class: "muted", text: ` ${j.queue} · ${j.pods} pods · ${fmt(j.gpus)} GPUs` })));
    })));
  }

  function markSelected() {
    for (const b of document.querySelectorAll("button.pending-job")) {
      const on = selected && b.dataset.job === selected.name && b.dataset.tenant === selected.tenant;
      b.setAttribute("aria-pressed", on ? "true" : "false");
    }
  }

  async function explain(job, loud) {
    const path = `/v1/jobs/${encodeURIComponent(job.name)}/explain?tenant=`
      + encodeURIComponent(job.tenant);
    let body;
    try {
      body = await api(path);
    } catch (err) {
      if (err instanceof AuthError) throw err;
      if (loud) showError(String(err.message || err));
      return;
    }
    if (!selected || selected.name !== job.name || selected.tenant !== job.tenant) return;
    if (!changed("explain", body) && !loud) return;
    rendered.set("explain", JSON.stringify(body));
    const head = h("p", { class: "explain-head" },
      h("strong", { text: `${job.tenant}/${body.job}` }), ` is ${body.state}`,
      body.cluster ? ` on ${body.cluster}` : "", body.reason ? `: ${body.reason}` : "");
    const rows = (body.clusters || []).map((c) => h("tr", { "data-cluster": c.cluster },
      h("th", { scope: "row", text: c.cluster }),
      h("td", { class: c.fits ? "yes" : "no", text: c.fits ? "fits" : "does not fit" }),
      h("td", { text: c.largestFit }),
      h("td", {}, c.reasons.length ? h("ul", { class: "reasons" },
        c.reasons.map((r) => h("li", {}, h("code", { text: r.code }), " ", r.message))) : "—")));
    $("explain").replaceChildren(head, rows.length
      ? table(["Cluster", "Now", "Largest fit (pods)", "Reasons"], rows, "Explain per cluster")
      : h("p", { class: "muted", text: "Not waiting in a queue: nothing to explain." }),
      ...whatNext(body));
    $("explain").dataset.job = `${job.tenant}/${body.job}`;
  }

  // What happens next to a waiting job: its place in the queues, its burst option.
  const ordinal = (n) => n + ((n % 100 >= 11 && n % 100 <= 13) ? "th"
    : ({ 1: "st", 2: "nd", 3: "rd" }[n % 10] || "th"));
  const when = (at) => {
    const left = Math.round(at - Date.now() / 1000);
    return left <= 0 ? "now" : `in ${left >= 60 ? Math.round(left / 60) + " min" : left + " s"}`;
  };

  function whatNext(body) {
    const out = [];
    const p = body.position;
    if (p) {
      out.push(h("p", { class: "explain-position", "data-position": p.position ?? "" },
        h("strong", { text: "Queue: " }), p.position === null
          ? `backing off after a failed attempt; tried again ${when(p.backoffUntil)}`
          : `${ordinal(p.position)} of ${p.waiting} waiting (${ordinal(p.inQueue)} of `
            + `${p.queueWaiting} in ${p.queue}); ${p.sameGpuTypeAhead} ahead may take `
            + "the same GPU type"));
    }
    const b = body.burst;
    if (b) {
      const attrs = { class: "explain-burst", "data-status": b.status, "data-pool": b.pool };
      const cost = `${money(b.costPerHour || 0)}/h (${money(b.costPerNodeHour || 0)}/node-h)`;
      const label = h("strong", { text: "Burst: " });
      if (b.status === "requested") {
        out.push(h("p", attrs, label, `${b.nodes} nodes requested from ${b.pool} `
          + `(${b.cluster}), ${b.arrived} up; ${cost}`));
      } else if (b.status === "planned") {
        out.push(h("p", attrs, label, `${b.pool} (${b.cluster}) grows by ${b.newNodes} `
          + `nodes, up about ${fmt(b.provisionSeconds)} s after the scale-up, ${cost}; `
          + `eligible ${when(b.eligibleAt)} (burstAfterSeconds ${fmt(b.burstAfterSeconds)})`));
      } else {
        out.push(h("div", attrs, label, "no pool can take it:", h("ul", { class: "refusals" },
          b.refusals.map((r) => h("li", { "data-code": r.code },
            r.pool ? `${r.pool}: ` : "", r.message, " ", h("code", { text: r.code }),
            r.until === null ? "" : ` (may grow again ${when(r.until)})`)))));
      }
    }
    return out;
  }

  // --- burst pools -----------------------------------------------------------------------------

  function renderPools(data) {
    if (!changed("pools", data)) return;
    const pools = data.pools || [];
    const boxes = (p) => {
      const out = [];
      for (let i = 0; i < p.ready; i++) out.push(h("span", { class: "box ready", "aria-hidden": "true" }));
      for (let i = 0; i < p.coming; i++) out.push(h("span", { class: "box coming", "aria-hidden": "true" }));
      return h("span", { class: "boxes", role: "img",
        "aria-label": `${p.ready} ready, ${p.coming} coming` }, out,
      h("span", { class: "boxes-text", text: ` ${p.ready} ready, ${p.coming} coming` }));
    };
    const parts = [pools.length ? table(
      ["Pool", "Cluster", "GPU", "Nodes", "Replicas (min–max)", "Status", "Node-hours",
        "Idle node-hours", "Cost"],
      pools.map((p) => h("tr", { "data-pool": p.pool },
        h("th", { scope: "row", text: p.pool }), h("td", { text: p.cluster }),
        h("td", { text: p.gpuType }), h("td", {}, boxes(p)),
        h("td", { text: `${p.replicas} (${p.minNodes}–${p.maxNodes})` }),
        h("td", { class: p.failing ? "no" : "", text: p.failing ? "failing, backing off" : "ok" }),
        h("td", { text: fmt(p.nodeHours) }), h("td", { text: fmt(p.idleNodeHours) }),
        h("td", { text: `${money(p.cost)} (${money(p.costPerNodeHour)}/node-h)` }))),
      "Burst pools") : h("p", { class: "muted", text: "No burst pools configured." })];
    const waiting = data.requests || [];
    parts.push(h("h3", { text: "Gangs waiting for burst nodes" }));
    parts.push(waiting.length ? h("ul", { class: "requests" }, waiting.map((r) =>
      h("li", { text: `${r.job}: ${r.arrived} of ${r.nodes} nodes from ${r.pool} up` })))
      : h("p", { class: "muted", text: "None." }));
    $("pools").replaceChildren(...parts);
  }

  // --- events ------------------------------------------------------------------------------------

  function logEvent(data) {
    const list = $("events");
    const at = data.at ? new Date(data.at * 1000).toLocaleTimeString() : "";
    const text = `${at} ${data.tenant}/${data.name} → ${data.state}`
      + (data.cluster ? ` on ${data.cluster}` : "") + (data.reason ? ` (${data.reason})` : "");
    list.prepend(h("li", { "data-job": data.name, "data-state": data.state, text }));
    while (list.children.length > MAX_EVENTS) list.lastElementChild.remove();
  }

  function handle(block) {
    let kind = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue; // comment: subscribed, keepalive
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
      if (field === "event") kind = value;
      else if (field === "data") data.push(value);
    }
    if (!data.length) return;
    if (kind === "job") {
      try { logEvent(JSON.parse(data.join("\n"))); } catch (_) { /* not ours to judge */ }
    }
    schedule(); // job, capacity, dropped: re-read the affected state
  }

  function setLive(state, text) {
    const status = $("status");
    status.dataset.live = state;
    status.textContent = text;
  }

  async function listen(ctrl) {
    let backoff = 1000;
    while (token && !ctrl.signal.aborted) {
      try {
        const resp = await fetch("/v1/events", {
          headers: { Authorization: "Bearer " + token, Accept: "text/event-stream" },
          cache: "no-store", signal: ctrl.signal,
        });
        if (resp.status === 401) { logout("the token was refused"); return; }
        if (!resp.ok || !resp.body) throw new Error(`events: HTTP ${resp.status}`);
        // Subscribed before the headers went out: from here on nothing is missed.
        setLive("live", "Live: updating on events");
        backoff = 1000;
        schedule();
        const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value.replace(/\r\n?/g, "\n");
          let end;
          while ((end = buf.indexOf("\n\n")) >= 0) {
            handle(buf.slice(0, end));
            buf = buf.slice(end + 2);
          }
        }
      } catch (err) {
        if (ctrl.signal.aborted) return;
      }
      setLive("reconnecting", `Reconnecting to events in ${backoff / 1000} s `
        + `(refreshing every ${FALLBACK_MS / 1000} s meanwhile)`);
      await new Promise((resolve) => setTimeout(resolve, backoff));
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    }
  }

  // --- token ---------------------------------------------------------------------------------------

  function start(newToken) {
    token = newToken;
    sessionStorage.setItem(KEY, token);
    $("login").hidden = true;
    $("logout").hidden = false;
    $("main").hidden = false;
    rendered.clear();
    if (stream) stream.abort();
    stream = new AbortController();
    setLive("connecting", "Connecting…");
    refresh();
    listen(stream);
  }

  function logout(reason) {
    token = null;
    sessionStorage.removeItem(KEY);
    if (stream) stream.abort();
    stream = null;
    clearTimeout(timer);
    $("main").hidden = true;
    $("login").hidden = false;
    $("logout").hidden = true;
    setLive("off", "Not connected");
    showError(reason || "");
  }

  // /#token=...: a fragment never reaches the server; take it and wipe it from the URL.
  function tokenFromFragment() {
    const match = /(?:^#|&)token=([^&]+)/.exec(location.hash);
    if (!match) return null;
    history.replaceState(null, "", location.pathname + location.search);
    return decodeURIComponent(match[1]);
  }

  window.addEventListener("hashchange", () => {
    const given = tokenFromFragment();
    if (given) start(given);
  });

  document.addEventListener("DOMContentLoaded", () => {
    const given = tokenFromFragment();
    if (given) sessionStorage.setItem(KEY, given);
    $("login").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const value = $("token").value.trim();
      $("token").value = "";
      if (value) start(value);
    });
    $("logout").addEventListener("click", () => logout(""));
    setInterval(schedule, FALLBACK_MS);
    const saved = sessionStorage.getItem(KEY);
    if (saved) start(saved);
  });
})();

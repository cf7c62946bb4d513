// The bgtask dashboard: one page over the host's /api and its /events stream. No framework,
// nothing fetched from anywhere but the host.
"use strict";

const TERMINATIONS = {
  exited: ["ended as asked", "--ok"], suspended: ["suspended after its work", "--suspended"],
  watchdog: ["watchdog kill", "--watchdog"], jetsam: ["jetsam (memory)", "--jetsam"], crashed: ["crashed", "--crashed"],
  "cpu-limit": ["CPU limit", "--cpu"], disk: ["disk reserve", "--disk"], "disk-quota": ["disk quota", "--disk"],
  "launch-failed": ["launch failed", "--failed"], "host-lost": ["host lost", "--failed"], running: ["running now", "--running"],
};
const colour = (t) => getComputedStyle(document.documentElement).getPropertyValue((TERMINATIONS[t] || ["", "--failed"])[1]).trim();
const $ = (selector) => document.querySelector(selector);
const esc = (text) => String(text ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const ms = (v) => v == null ? "" : v < 1000 ? `${v.toFixed(0)} ms` : v < 120000 ? `${(v / 1000).toFixed(1)} s` : `${(v / 60000).toFixed(1)} min`;
const mib = (b) => b == null ? "?" : `${(b / 1048576).toFixed(1)} MiB`;
const time = (d) => new Date(d).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });

const state = {
  records: new Map(),   // launch_id -> record
  running: new Map(),   // launch_id -> running launch
  apps: [],
  range: 3600,          // seconds shown
  end: null,            // right edge (ms since 1970); null: follow now
  selected: null,
  actions: false,
  pushes: [],           // the host's pushes (/api/pushes), marks on the timeline
  transfers: [],        // its transfers (/api/transfers), spans on the timeline
};

async function get(path) {
  const response = await fetch(path, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
  return response.json();
}

async function act(request) {
  const response = await fetch("/api/action", {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Bgtask-Action": "1" }, body: JSON.stringify(request),
  });
  const text = await response.text();
  const out = $("#action-result");
  // Refused by the dashboard (HTTP), or by the host (`ok: false`, as on the control socket).
  let refused = !response.ok;
  try { refused ||= JSON.parse(text).ok === false; } catch { /* not JSON: the dashboard's refusal */ }
  if (out) {
    out.textContent = `${request.verb}: ${response.ok ? summarise(text) : text}`;
    out.classList.toggle("failed", refused);
  } else if (refused) {
    alert(text);
  }
  refresh();
  drawEvents().catch(console.error);
}

// What an action's answer says, in a line or a few.
function summarise(text) {
  try {
    const answer = JSON.parse(text);
    if (answer.error) return `refused: ${answer.error.message || JSON.stringify(answer.error)}`;
    if (answer.message) return answer.message;
    const keys = Object.keys(answer).filter((k) => answer[k] != null && k !== "ok");
    return keys.length ? keys.map((k) => `${k}: ${typeof answer[k] === "object" ? JSON.stringify(answer[k]).slice(0, 300) : answer[k]}`).join("\n") : "done";
  } catch {
    return text;
  }
}

// MARK: The timeline

const ROW = 26, LABEL = 230, AXIS = 24;

// The timeline's rows: every app (and any app something happened to), narrowed by the filter
// box and, when asked (by default with more than 30 apps), to apps with something in the span.
function rows(start, end) {
  const names = new Set(state.apps.map((a) => a.identifier));
  for (const r of state.records.values()) names.add(r.app);
  for (const r of state.running.values()) names.add(r.app);
  for (const p of state.pushes) names.add(p.app);
  for (const t of state.transfers) names.add(t.app);
  const filter = ($("#app-filter")?.value || "").toLowerCase();
  let shown = [...names].filter((n) => !filter || n.toLowerCase().includes(filter));
  if ($("#active-only")?.checked) {
    const active = new Set();
    for (const r of state.records.values()) {
      const begin = Date.parse(r.started_at);
      if (begin <= end && begin + r.wall_ms >= start) active.add(r.app);
    }
    for (const r of state.running.values()) active.add(r.app);
    for (const p of state.pushes) { const t = Date.parse(p.received_at); if (t >= start && t <= end) active.add(p.app); }
    for (const t of state.transfers) if (!t.finished_at || Date.parse(t.finished_at) >= start) active.add(t.app);
    shown = shown.filter((n) => active.has(n));
  }
  return shown.sort();
}

function drawTimeline() {
  const svg = $("#timeline");
  const width = svg.clientWidth || 1000;
  const now = Date.now();
  const end = state.end ?? now;
  const start = end - state.range * 1000;
  const apps = rows(start, end);
  const height = AXIS + Math.max(apps.length, 1) * ROW + 6;
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const x = (t) => LABEL + ((t - start) / (end - start)) * (width - LABEL - 8);
  const parts = [];
  // The axis: about eight ticks at round steps.
  const steps = [1, 5, 10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 86400].map((s) => s * 1000);
  const step = steps.find((s) => (end - start) / s <= 8) || 86400000;
  parts.push('<g class="axis">');
  for (let t = Math.ceil(start / step) * step; t <= end; t += step) {
    const label = step >= 86400000 ? new Date(t).toLocaleDateString() : new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: step < 60000 ? "2-digit" : undefined });
    parts.push(`<line x1="${x(t)}" x2="${x(t)}" y1="${AXIS - 4}" y2="${height}"/><text x="${x(t) + 3}" y="14">${esc(label)}</text>`);
  }
  parts.push("</g>");
  apps.forEach((app, index) => {
    const y = AXIS + index * ROW;
    parts.push(`<text class="row-label" x="6" y="${y + 17}">${esc(app.length > 32 ? "…" + app.slice(-31) : app)}</text>`);
    parts.push(`<line class="row-line" x1="0" x2="${width}" y1="${y + ROW}" y2="${y + ROW}"/>`);
  });
  const rowOf = new Map(apps.map((a, i) => [a, i]));
  const bar = (launch, begin, finish, termination, budgetMs, expiredMs, killed) => {
    if (finish < start || begin > end) return;
    const y = AXIS + rowOf.get(launch.app) * ROW + 4;
    const left = Math.max(x(begin), LABEL), right = Math.min(x(finish), width - 8);
    const w = Math.max(right - left, 3);
    parts.push(`<rect class="bar" data-launch="${esc(launch.launch_id)}" data-termination="${esc(termination)}" x="${left}" y="${y}" width="${w}" height="${ROW - 8}" rx="2" fill="${colour(termination)}"/>`);
    if (budgetMs != null) {
      const b = x(begin + budgetMs);
      if (b >= LABEL && b <= width) parts.push(`<line class="budget" x1="${b}" x2="${b}" y1="${y - 2}" y2="${y + ROW - 6}"><title>budget ends</title></line>`);
    }
    if (expiredMs != null) {
      const e = x(begin + expiredMs);
      if (e >= LABEL && e <= width) parts.push(`<path class="expired" d="M${e - 4},${y - 3} L${e + 4},${y - 3} L${e},${y + 3} Z"><title>expired at ${ms(expiredMs)}</title></path>`);
    }
    if (killed) {
      const k = x(finish);
      if (k >= LABEL && k <= width) parts.push(`<path class="kill" d="M${k - 4},${y + 2} L${k + 4},${y + ROW - 10} M${k + 4},${y + 2} L${k - 4},${y + ROW - 10}"><title>killed: ${esc(termination)}</title></path>`);
    }
  };
  for (const r of state.records.values()) {
    if (!rowOf.has(r.app)) continue;
    const begin = Date.parse(r.started_at);
    bar(r, begin, begin + r.wall_ms, r.termination, r.budget_ms, r.expired_at_ms, ["watchdog", "jetsam", "cpu-limit", "disk", "disk-quota"].includes(r.termination));
  }
  for (const r of state.running.values()) {
    if (!rowOf.has(r.app) || state.records.has(r.launch_id)) continue;
    const begin = Date.parse(r.started_at);
    bar(r, begin, now, "running", r.budget_ms, null, false);
  }
  // Pushes: a dot where each came in (filled once delivered); transfers: a thin line under the
  // row from creation to the end (or now), a diamond where it finished.
  for (const p of state.pushes) {
    const t = Date.parse(p.received_at);
    if (!rowOf.has(p.app) || t < start || t > end) continue;
    const y = AXIS + rowOf.get(p.app) * ROW + ROW - 3;
    parts.push(`<circle class="event push ${esc(p.state)}" data-push="${esc(p.id)}" cx="${x(t)}" cy="${y}" r="3.5"><title>push ${esc(p.id)} (${esc(p.kind)}, priority ${p.priority}): ${esc(p.state)}${p.detail ? "\n" + esc(p.detail) : ""}\n${esc(new Date(t).toLocaleString())}</title></circle>`);
  }
  for (const t of state.transfers) {
    const from = Date.parse(t.created_at), to = t.finished_at ? Date.parse(t.finished_at) : now;
    if (!rowOf.has(t.app) || to < start || from > end) continue;
    const y = AXIS + rowOf.get(t.app) * ROW + ROW - 2;
    const left = Math.max(x(from), LABEL), right = Math.min(x(to), width - 8);
    const title = `<title>transfer ${esc(t.id)} ${esc(t.kind)}: ${esc(t.state)}\n${esc(t.url)}\n${mib(t.bytes_received || t.bytes_sent)} of ${mib(t.bytes_expected_to_receive || t.bytes_expected_to_send)}</title>`;
    parts.push(`<line class="event transfer" data-transfer="${esc(t.id)}" x1="${left}" x2="${Math.max(right, left + 2)}" y1="${y}" y2="${y}">${title}</line>`);
    if (t.finished_at && to >= start && to <= end) parts.push(`<path class="event transfer-end" d="M${x(to)},${y - 4} L${x(to) + 4},${y} L${x(to)},${y + 4} L${x(to) - 4},${y} Z">${title}</path>`);
  }
  if (now >= start && now <= end) parts.push(`<line class="now" x1="${x(now)}" x2="${x(now)}" y1="${AXIS - 6}" y2="${height}"/>`);
  svg.innerHTML = parts.join("");
}

function tooltipFor(id) {
  const r = state.records.get(id);
  if (r) {
    const tasks = (r.tasks || []).map((t) => `  ${t.identifier}: ${t.outcome}`).join("\n");
    return `${r.app}  ${r.launch_id}\n${(TERMINATIONS[r.termination] || [r.termination])[0]} after ${ms(r.wall_ms)} (budget ${ms(r.budget_ms)})\n` +
      `reason: ${r.reason}\n${tasks}${r.error ? "\n" + r.error : ""}\npeak ${mib(r.peak_rss_bytes)} of ${mib(r.memory_limit_bytes)}, cpu ${ms(r.cpu_ms)}`;
  }
  const l = state.running.get(id);
  return l ? `${l.app}  ${l.launch_id}\nrunning for ${ms(Date.now() - Date.parse(l.started_at))} of ${ms(l.budget_ms)}\n${l.identifiers.join("\n")}` : id;
}

function wireTimeline() {
  const svg = $("#timeline"), tip = $("#tooltip");
  svg.addEventListener("mousemove", (event) => {
    const id = event.target.dataset?.launch;
    if (!id) { tip.hidden = true; return; }
    tip.textContent = tooltipFor(id);
    tip.style.left = `${event.clientX + 14}px`;
    tip.style.top = `${event.clientY + 14}px`;
    tip.hidden = false;
  });
  svg.addEventListener("mouseleave", () => { tip.hidden = true; });
  svg.addEventListener("click", (event) => {
    const id = event.target.dataset?.launch;
    if (id && !dragged) showLaunch(id);
  });
  svg.addEventListener("wheel", (event) => {
    event.preventDefault();
    const rect = svg.getBoundingClientRect();
    const end = state.end ?? Date.now(), start = end - state.range * 1000;
    const at = start + ((event.clientX - rect.left - LABEL) / (rect.width - LABEL - 8)) * (end - start);
    const factor = event.deltaY > 0 ? 1.25 : 0.8;
    const range = Math.min(Math.max(state.range * factor, 10), 30 * 86400);
    const newEnd = at + (end - at) * (range / state.range);
    state.range = range;
    state.end = newEnd >= Date.now() ? null : newEnd;
    drawTimeline();
  }, { passive: false });
  let dragStart = null, dragged = false;
  svg.addEventListener("mousedown", (event) => { dragStart = { x: event.clientX, end: state.end ?? Date.now() }; dragged = false; });
  window.addEventListener("mouseup", () => { dragStart = null; });
  window.addEventListener("mousemove", (event) => {
    if (!dragStart) return;
    const dx = event.clientX - dragStart.x;
    if (Math.abs(dx) > 3) dragged = true;
    const perPixel = (state.range * 1000) / (svg.clientWidth - LABEL - 8);
    const end = dragStart.end - dx * perPixel;
    state.end = end >= Date.now() ? null : end;
    drawTimeline();
  });
  for (const button of document.querySelectorAll("[data-range]")) {
    button.addEventListener("click", () => { state.range = Number(button.dataset.range); state.end = null; markRange(); drawTimeline(); });
  }
  $("#follow").addEventListener("click", () => { state.end = null; drawTimeline(); });
  $("#app-filter").addEventListener("input", drawTimeline);
  $("#active-only").addEventListener("change", drawTimeline);
  window.addEventListener("resize", drawTimeline);
  $("#legend").innerHTML = Object.entries(TERMINATIONS).filter(([t]) => !["disk-quota", "host-lost"].includes(t))
    .map(([t, [label]]) => `<span><i style="background:${colour(t)}"></i>${esc(label)}</span>`).join("") +
    '<span>┆ budget ends</span><span style="color:#f9ab00">▼</span><span>expired</span><span>✕ killed</span><span>● push</span><span>─◆ transfer</span>';
  markRange();
}

function markRange() {
  for (const button of document.querySelectorAll("[data-range]")) button.classList.toggle("on", Number(button.dataset.range) === state.range);
}

// MARK: One launch

const LEVELS = { debug: 0, info: 1, default: 2, error: 3, fault: 4 };

function lineLevel(line) {
  const os = /\[os:(\w+)\]/.exec(line);
  if (os) return LEVELS[os[1]] ?? 2;
  const tag = /^\[bgtask (\w+)\]/.exec(line);
  if (tag) return tag[1] === "debug" ? 0 : tag[1] === "error" ? 3 : 1;
  return 2;
}

let launchLog = "";

async function showLaunch(id) {
  const page = await get(`/api/launch/${encodeURIComponent(id)}`);
  if (!page) return;
  state.selected = id;
  $("#launch-section").hidden = false;
  const r = page.record;
  if (!r) {
    // Still running: what is known so far.
    const l = page.running;
    $("#launch-title").textContent = `${l.launch_id} (${l.app}), running`;
    const elapsed = Date.now() - Date.parse(l.started_at);
    $("#launch-summary").innerHTML = [
      ["state", `<span class="term" style="background:${colour("running")}">running</span>${l.expired ? " expired, in its grace" : ""}${l.work_over ? ", its work over" : ""}`],
      ["reason", esc(l.reason)], ["started", esc(new Date(l.started_at).toLocaleString())],
      ["time", `${ms(elapsed)} of a ${ms(l.budget_ms)} budget + ${ms(l.grace_ms)} grace`],
      ["memory", `${mib(l.resident_bytes)} of ${mib(l.memory_limit_bytes)}`],
      ["tasks", l.identifiers.map(esc).join("<br>") || "none"], ["pid", esc(l.pid)],
    ].map(([k, v]) => `<dt>${esc(k)}</dt><dd>${v}</dd>`).join("");
    drawUsage(page.samples, l.memory_limit_bytes, l.budget_ms, null, elapsed);
    launchLog = page.log || "";
    drawLog();
    return;
  }
  $("#launch-title").textContent = `${r.launch_id} (${r.app})`;
  const facts = [
    ["termination", `<span class="term" style="background:${colour(r.termination)}">${esc(r.termination)}</span> ${esc(r.error || "")}`],
    ["reason", esc(r.reason)],
    ["started", esc(new Date(r.started_at).toLocaleString())],
    ["time", `${ms(r.wall_ms)} of a ${ms(r.budget_ms)} budget + ${ms(r.grace_ms)} grace${r.expired_at_ms != null ? `; expired at ${ms(r.expired_at_ms)}` : ""}${r.expiration_reason ? ` (${esc(r.expiration_reason)})` : ""}`],
    ["memory", `peak ${mib(r.peak_rss_bytes)} of ${mib(r.memory_limit_bytes)} (${esc(r.memory_mechanism)})`],
    ["cpu", `${ms(r.cpu_ms)}${r.energy ? `; ${r.energy.wakeups} wake-ups, ${mib(r.energy.disk_written_bytes)} written${r.energy.network_sent_bytes != null ? `, ${mib(r.energy.network_sent_bytes)} sent, ${mib(r.energy.network_received_bytes)} received` : ""}; cpu limit ${esc(r.energy.cpu_limit)}` : ""}`],
    ["tasks", (r.tasks || []).map((t) => `${esc(t.identifier)} <b>${esc(t.outcome)}</b>${t.started_ms != null ? ` started ${ms(t.started_ms)}` : ""}${t.expired_ms != null ? `, expired ${ms(t.expired_ms)}` : ""}${t.completed_ms != null ? `, completed ${ms(t.completed_ms)}` : ""}`).join("<br>") || "none"],
    ["background time", (r.background_time || []).map((a) => `${esc(a.name || "#" + a.id)}: ${esc(a.outcome)}, began ${ms(a.began_ms)}${a.ended_ms != null ? `, ended ${ms(a.ended_ms)}` : ""}${a.expired_ms != null ? `, expired ${ms(a.expired_ms)}` : ""}`).join("<br>") || "none"],
    ["sandbox", Object.entries(r.sandbox || {}).filter(([, v]) => v.applied).map(([k]) => esc(k)).join(", ") || "none"],
    ["process", r.resumed ? `resumed after ${ms(r.suspended_ms)} suspended (launch ${r.process_launches} of its process)` : esc(r.previous_process || "new")],
  ];
  $("#launch-summary").innerHTML = facts.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${v}</dd>`).join("");
  drawUsage(page.samples, r.memory_limit_bytes, r.budget_ms, r.expired_at_ms, r.wall_ms);
  launchLog = page.log || "";
  drawLog();
  $("#launch-section").scrollIntoView({ behavior: "smooth" });
}

// Memory (against the jetsam line) and CPU over the launch, from the supervisor's samples.
function drawUsage(samples, limit, budgetMs, expiredMs, endMs) {
  const box = $("#launch-usage");
  if (!samples || samples.length < 2) {
    box.innerHTML = `<p class="hint">${samples?.length ? "one sample" : "no samples"} of memory and CPU (taken every second or more while a launch runs, where the host samples memory)</p>`;
    return;
  }
  const W = 760, H = 170, L = 64, R = 54, T = 10, B = 22;
  const last = Math.max(samples[samples.length - 1].ms, endMs || 0);
  const span = Math.max(last, 1);
  const top = Math.max(limit || 0, ...samples.map((p) => p.resident_bytes)) * 1.05 || 1;
  const cpu = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    if (a.cpu_ms != null && b.cpu_ms != null && b.ms > a.ms) cpu.push([b.ms, Math.max(0, (100 * (b.cpu_ms - a.cpu_ms)) / (b.ms - a.ms))]);
  }
  const cpuTop = Math.max(100, ...cpu.map(([, v]) => v));
  const x = (t) => L + (t / span) * (W - L - R), ym = (b) => T + (1 - b / top) * (H - T - B), yc = (v) => T + (1 - v / cpuTop) * (H - T - B);
  const parts = [`<svg id="usage-chart" viewBox="0 0 ${W} ${H}" width="${W}" height="${H}" role="img" aria-label="memory and CPU over the launch">`];
  parts.push(`<line class="axis" x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}"/>`);
  parts.push(`<text class="axis-label" x="${L}" y="${H - 6}">0</text><text class="axis-label" x="${W - R}" y="${H - 6}" text-anchor="end">${ms(last)}</text>`);
  parts.push(`<text class="axis-label mem" x="${L - 6}" y="${ym(top / 1.05) + 4}" text-anchor="end">${mib(top / 1.05)}</text>`);
  parts.push(`<text class="axis-label cpu" x="${W - R + 6}" y="${yc(cpuTop) + 8}">${cpuTop.toFixed(0)} %</text>`);
  if (limit) parts.push(`<line class="jetsam-line" x1="${L}" x2="${W - R}" y1="${ym(limit)}" y2="${ym(limit)}"><title>memory limit (jetsam) ${mib(limit)}</title></line><text class="axis-label jetsam" x="${L + 4}" y="${ym(limit) - 3}">jetsam ${mib(limit)}</text>`);
  if (budgetMs && budgetMs <= span) parts.push(`<line class="budget-line" x1="${x(budgetMs)}" x2="${x(budgetMs)}" y1="${T}" y2="${H - B}"><title>budget ends</title></line>`);
  if (expiredMs != null && expiredMs <= span) parts.push(`<line class="expired-line" x1="${x(expiredMs)}" x2="${x(expiredMs)}" y1="${T}" y2="${H - B}"><title>expired</title></line>`);
  parts.push(`<polyline class="mem-line" points="${samples.map((p) => `${x(p.ms).toFixed(1)},${ym(p.resident_bytes).toFixed(1)}`).join(" ")}"><title>resident memory</title></polyline>`);
  if (cpu.length) parts.push(`<polyline class="cpu-line" points="${cpu.map(([t, v]) => `${x(t).toFixed(1)},${yc(v).toFixed(1)}`).join(" ")}"><title>CPU, % of one core</title></polyline>`);
  parts.push("</svg>");
  const peak = Math.max(...samples.map((p) => p.resident_bytes));
  box.innerHTML = `<h3>Memory and CPU <span class="count">${samples.length} samples; peak ${mib(peak)}; <span class="mem">━ memory</span> <span class="cpu">━ CPU % of a core</span></span></h3>` + parts.join("");
}

function drawLog() {
  const minimum = Number($("#log-level").value), filter = $("#log-filter").value.toLowerCase();
  const lines = launchLog.split("\n").filter((l) => l && lineLevel(l) >= minimum && (!filter || l.toLowerCase().includes(filter)));
  const cls = (l) => ["l-debug", "", "", "l-error", "l-fault"][lineLevel(l)];
  $("#launch-log").innerHTML = lines.map((l) => `<span class="${cls(l)}">${esc(l)}</span>`).join("\n") || "(nothing)";
  $("#log-count").textContent = `${lines.length} line(s)`;
}

// MARK: The tables

function meter(value, limit, text) {
  const share = limit > 0 ? value / limit : 0;
  return `<span class="meter ${share > 1 ? "over" : share > 0.8 ? "warn" : ""}"><span style="width:${Math.min(share, 1) * 100}%"></span></span><span class="meter-text">${text}</span>`;
}

function drawRunning() {
  const now = Date.now();
  const rows = [...state.running.values()].map((l) => {
    const elapsed = now - Date.parse(l.started_at);
    const expire = state.actions ? l.identifiers.map((i) => `<button class="act" data-act="expire" data-id="${esc(i)}" title="simulate the expiration of ${esc(i)}">expire</button>`).join(" ") : "";
    return `<tr class="clickable" data-launch="${esc(l.launch_id)}"><td>${esc(l.app)}</td><td>${esc(l.launch_id)} <span class="state">${esc(l.role)}</span></td><td>${l.identifiers.map(esc).join("<br>")}</td>` +
      `<td>${meter(elapsed, l.budget_ms, `${ms(elapsed)} / ${ms(l.budget_ms)}${l.expired ? " expired" : ""}`)}</td>` +
      `<td>${meter(l.resident_bytes || 0, l.memory_limit_bytes, `${mib(l.resident_bytes)} / ${mib(l.memory_limit_bytes)}`)}</td><td>${expire}</td></tr>`;
  });
  $("#running tbody").innerHTML = rows.join("") || '<tr><td colspan="6">nothing is running</td></tr>';
  $("#running-count").textContent = `(${state.running.size})`;
}

function drawOverview(overview) {
  state.actions = overview.actions;
  state.clockMode = overview.clock?.mode;
  $("#clock").textContent = `${overview.clock?.mode === "virtual" ? "virtual clock " : ""}${new Date(overview.clock?.now || overview.now).toLocaleString()}`;
  $("#pending tbody").innerHTML = overview.pending.map(({ request, why }) => {
    const blockers = (why?.blockers || []).map((b) => `<span class="blocker ${b.blocking ? "" : "note"}">${b.blocking ? "" : "note: "}${esc(b.message)} <code>${esc(b.code)}</code></span>`).join("");
    const eligible = why && why.state === "pending" && !(why.blockers || []).some((b) => b.blocking);
    const run = state.actions ? `<button class="act" data-act="launch" data-app="${esc(request.app)}" data-id="${esc(request.request.identifier)}">run now</button> ` +
      `<button class="act" data-act="cancel" data-app="${esc(request.app)}" data-id="${esc(request.request.identifier)}">cancel</button>` : "";
    return `<tr data-app="${esc(request.app)}" data-identifier="${esc(request.request.identifier)}"><td>${esc(request.app)}</td><td>${esc(request.request.identifier)}</td><td>${esc(request.request.kind)}</td>` +
      `<td>${esc(new Date(request.submittedAt).toLocaleString())}</td><td class="why">${request.runningLaunch ? "running now" : eligible ? "eligible: it runs at the next launch" : blockers || "…"}</td><td>${run}</td></tr>`;
  }).join("") || '<tr><td colspan="6">no pending request</td></tr>';
  $("#pending-count").textContent = `(${overview.pending.length})`;
  if (!state.appsSeen && overview.apps.length > 30) $("#active-only").checked = true;
  state.appsSeen = true;
  state.apps = overview.apps;
  $("#apps tbody").innerHTML = overview.apps.map((a) => `<tr><td>${esc(a.identifier)}<br><small>${esc(a.path)}</small></td>` +
    `<td><span class="state ${esc(a.process || (a.running ? "running" : "not-running"))}">${esc(a.process || (a.running ? "running" : "not running"))}</span>${a.processBytes ? " " + mib(a.processBytes) : ""}${a.lastEviction ? `<br><small>last evicted: ${esc(a.lastEviction)}</small>` : ""}</td>` +
    `<td title="${esc((a.permittedIdentifiers || []).join("\n"))}">${(a.permittedIdentifiers || []).slice(0, 3).map(esc).join("<br>")}${(a.permittedIdentifiers || []).length > 3 ? `<br><small>and ${a.permittedIdentifiers.length - 3} more</small>` : ""}</td><td>${(a.backgroundModes || []).map(esc).join(", ")}</td><td>${a.pending}</td>` +
    `<td>${a.penaltyLevel ? `level ${a.penaltyLevel}` : ""}</td><td>${appDetails(a)}</td><td>${lastLaunches(a.identifier)}</td></tr>`).join("");
  $("#apps-count").textContent = `(${overview.apps.length})`;
  const device = overview.device || {};
  const sources = device.sources || {};
  $("#device").innerHTML = Object.entries(device).filter(([k]) => k !== "sources")
    .map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(typeof v === "object" ? JSON.stringify(v) : v)}${sources[k] ? ` <small>(${esc(sources[k])})</small>` : ""}</dd>`).join("") +
    `<dt>clock</dt><dd>${esc(overview.clock?.mode)}${overview.clock?.nextDue ? `, next due ${esc(new Date(overview.clock.nextDue).toLocaleString())}` : ""}</dd>`;
  state.running = new Map(overview.running.map((l) => [l.launch_id, l]));
  drawRunning();
  drawActions();
}

// An app's entitlements and groups (its bundle), and its sandbox and disk at its last launch.
function appDetails(a) {
  const last = latestRecord(a.identifier);
  const lines = [];
  if ((a.entitlements || []).length) lines.push(`entitlements: ${a.entitlements.map(esc).join(", ")}`);
  if ((a.appGroups || []).length) lines.push(`groups: ${a.appGroups.map(esc).join(", ")}`);
  if (last?.sandbox) {
    const layers = Object.entries(last.sandbox);
    lines.push(`sandbox: ${layers.filter(([, v]) => v.applied).map(([k]) => esc(k)).join(", ") || "none"}${layers.some(([, v]) => !v.applied) ? ` <small>(not: ${layers.filter(([, v]) => !v.applied).map(([k]) => esc(k)).join(", ")})</small>` : ""}`);
  }
  if (last?.disk) {
    const d = last.disk;
    lines.push(`disk: ${d.bytes != null ? mib(d.bytes) : "?"}${d.quota_bytes ? ` of ${mib(d.quota_bytes)}` : ""}${d.inodes != null ? `, ${d.inodes} files${d.quota_inodes ? ` of ${d.quota_inodes}` : ""}` : ""}${d.exceeded ? ` <b>${esc(d.exceeded)}</b>` : ""}`);
  }
  return lines.map((l) => `<small>${l}</small>`).join("<br>");
}

function recordsOf(app) {
  return [...state.records.values()].filter((r) => r.app === app).sort((a, b) => Date.parse(b.started_at) - Date.parse(a.started_at));
}

function latestRecord(app) {
  let latest = null;
  for (const r of state.records.values()) if (r.app === app && (!latest || r.started_at > latest.started_at)) latest = r;
  return latest;
}

// An app's last launches: a square each, coloured by termination, newest first.
function lastLaunches(app) {
  return recordsOf(app).slice(0, 8).map((r) => `<span class="dot clickable" data-launch="${esc(r.launch_id)}" title="${esc(`${new Date(r.started_at).toLocaleString()}: ${r.termination} after ${ms(r.wall_ms)}`)}" style="background:${colour(r.termination)}"></span>`).join("");
}

async function drawEvents() {
  const [pushes, transfers, notifications] = await Promise.all([get("/api/pushes"), get("/api/transfers"), get("/api/notifications")]);
  state.pushes = pushes;
  state.transfers = transfers;
  drawTimeline();
  $("#pushes tbody").innerHTML = pushes.slice(0, 100).map((p) => `<tr><td>${esc(new Date(p.received_at).toLocaleString())}</td><td>${esc(p.app)}</td><td>${esc(p.kind)}</td><td>${esc(p.state)}</td><td>${esc(p.detail || "")}</td></tr>`).join("") || '<tr><td colspan="5">none</td></tr>';
  $("#transfers tbody").innerHTML = transfers.slice(0, 100).map((t) => {
    const total = t.bytes_expected_to_receive || t.bytes_expected_to_send || 0, done = t.bytes_received || t.bytes_sent || 0;
    return `<tr><td>${esc(t.app)}</td><td>${esc(t.url)}</td><td>${esc(t.state)}</td><td>${total > 0 ? meter(done, total, `${mib(done)} / ${mib(total)}`) : mib(done)}</td></tr>`;
  }).join("") || '<tr><td colspan="4">none</td></tr>';
  $("#notifications tbody").innerHTML = notifications.slice(-100).reverse().map((n) => `<tr><td>${esc(n.deliveredAt ? new Date(n.deliveredAt).toLocaleString() : "")}</td><td>${esc(n.app)}</td><td>${esc(n.content?.title || n.title || "")}</td><td>${esc(n.content?.body || n.body || "")}</td></tr>`).join("") || '<tr><td colspan="4">none</td></tr>';
}

async function refresh() {
  try {
    drawOverview(await get("/api/overview"));
    drawTimeline();
  } catch (error) {
    console.error(error);
  }
}

// MARK: Actions (when the host enables them)

function wireActions() {
  const form = (id, build) => $(id).addEventListener("submit", (event) => {
    event.preventDefault();
    const request = build(new FormData(event.target));
    if (request) act(request);
  });
  form("#act-launch", (f) => ({ verb: "simulate-launch", app: f.get("app"), identifier: f.get("identifier"), force: f.get("force") === "on", wait: false }));
  form("#act-expire", (f) => ({ verb: "simulate-expire", identifier: f.get("identifier") }));
  form("#act-push", (f) => {
    const push = { payload: f.get("payload"), push_type: f.get("push_type") };
    if (f.get("priority")) push.priority = Number(f.get("priority"));
    return { verb: "push", app: f.get("app"), push };
  });
  form("#act-device", (f) => ({ verb: "device", device: { [f.get("condition")]: f.get("value") } }));
  form("#act-clock", (f) => ({ verb: "clock", advance: Number(f.get("advance")) }));
  $("#act-launch select[name=app]").addEventListener("change", fillIdentifiers);
}

// The app choices of the action forms, and the chosen app's permitted identifiers.
function drawActions() {
  $("#actions-section").hidden = !state.actions;
  if (!state.actions) return;
  for (const select of document.querySelectorAll("#actions-section select[name=app]")) {
    const chosen = select.value;
    const names = state.apps.map((a) => a.identifier);
    if (select.dataset.names === names.join("\n")) continue;
    select.dataset.names = names.join("\n");
    select.innerHTML = names.map((n) => `<option${n === chosen ? " selected" : ""}>${esc(n)}</option>`).join("");
  }
  fillIdentifiers();
  $("#act-clock").hidden = state.clockMode !== "virtual";
}

function fillIdentifiers() {
  const app = state.apps.find((a) => a.identifier === $("#act-launch select[name=app]").value);
  const list = $("#identifiers");
  const ids = app?.permittedIdentifiers || [];
  if (list.dataset.app === app?.identifier) return;
  list.dataset.app = app?.identifier || "";
  list.innerHTML = ids.map((i) => `<option value="${esc(i)}"></option>`).join("");
}

// MARK: Live

function connect() {
  const events = new EventSource("/events");
  events.onopen = () => { $("#live").classList.remove("off"); };
  events.onerror = () => { $("#live").classList.add("off"); };
  events.addEventListener("launch-began", (event) => {
    const launch = JSON.parse(event.data);
    state.running.set(launch.launch_id, launch);
    drawTimeline();
    drawRunning();
  });
  events.addEventListener("launch-ended", (event) => {
    const record = JSON.parse(event.data);
    state.running.delete(record.launch_id);
    state.records.set(record.launch_id, record);
    drawTimeline();
    drawRunning();
    if (state.selected === record.launch_id) showLaunch(record.launch_id);
  });
}

async function start() {
  // A token given in the address was kept in a cookie by the host: drop it from the address bar.
  if (new URLSearchParams(location.search).has("token")) history.replaceState(null, "", location.pathname);
  wireTimeline();
  $("#launch-close").addEventListener("click", () => { $("#launch-section").hidden = true; state.selected = null; });
  $("#log-level").addEventListener("change", drawLog);
  $("#log-filter").addEventListener("input", drawLog);
  $("#pending").addEventListener("click", (event) => {
    const button = event.target.closest("button[data-act]");
    if (!button) return;
    if (button.dataset.act === "launch") act({ verb: "simulate-launch", identifier: button.dataset.id, app: button.dataset.app, force: true, wait: false });
    if (button.dataset.act === "cancel") act({ verb: "cancel", identifier: button.dataset.id, app: button.dataset.app });
  });
  $("#running").addEventListener("click", (event) => {
    const button = event.target.closest("button[data-act]");
    if (button) { act({ verb: "simulate-expire", identifier: button.dataset.id }); return; }
    const row = event.target.closest("tr[data-launch]");
    if (row) showLaunch(row.dataset.launch);
  });
  $("#apps").addEventListener("click", (event) => {
    const dot = event.target.closest("[data-launch]");
    if (dot) showLaunch(dot.dataset.launch);
  });
  wireActions();
  for (const record of await get("/api/history?limit=2000")) state.records.set(record.launch_id, record);
  // At first, the span of the history (15 seconds to a day), so that its bars can be seen.
  const starts = [...state.records.values()].map((r) => Date.parse(r.started_at));
  if (starts.length) state.range = Math.min(Math.max(((Date.now() - Math.min(...starts)) / 1000) * 1.3, 15), 86400);
  markRange();
  await refresh();
  connect();
  drawEvents().catch(console.error);
  setInterval(refresh, 2000);
  setInterval(() => drawEvents().catch(console.error), 10000);
  // Running bars grow with the clock.
  setInterval(() => { if (state.running.size) { drawTimeline(); drawRunning(); } }, 1000);
}

start();

// The gateway's live dashboard: reads the operator's snapshots (GET /dashboard/snapshots,
// Server-Sent Events, one a second) with the gateway's token and draws them. Plain
// JavaScript, no library: the gateway serves it as it is (gateway/dashboard.py says why
// the token travels as it does).
"use strict";

const SNAPSHOTS = "/dashboard/snapshots";
const TOKEN_KEY = "agentmars.dashboard.token";
const HISTORY_S = 600; // what the charts keep, and show at most
const MIN_SPAN_S = 60; // what they show at least, the time axis growing to HISTORY_S
const TIME_STEPS_S = [10, 15, 30, 60, 120, 300]; // between time ticks: the first giving six at most
const STALE_MS = 3000; // a snapshot is due every second
const DEAD_MS = 8000; // then the connection is given up and opened again
const RETRY_MS = 2000;

// Each chart's series: [colour name (a CSS variable), legend, value of a snapshot].
const CHARTS = {
  sessions: {
    series: [
      ["waiting", "waiting for admission", (s) => s.sessions.waiting],
      ["engine", "in the engine", (s) => s.sessions.engine],
      ["tool", "at a tool", (s) => s.sessions.tool],
      ["idle", "idle", (s) => s.sessions.idle],
      ["pinned", "holding pinned KV", (s) => s.kv_pinned_sessions],
    ],
  },
  admission: {
    series: [
      ["window", "window", (s) => s.window],
      ["queue", "queue", (s) => s.admission_queue],
    ],
  },
  kv: {
    series: [
      ["used", "used", (s) => s.kv_blocks.used],
      ["pinned", "pinned", (s) => s.kv_blocks.pinned],
    ],
    // Drawn against the pool's size, so the chart shows how full it is.
    top: (s) => sum(Object.values(s.kv_blocks)),
  },
  tools: {
    series: [
      // Calls running is cores busy as long as there are cores for them: one line.
      ["queued", "calls queued", (s) => s.tool_calls.queued],
      ["busy", "cores busy", (s) => s.tool_cores.busy],
      // Calls shorter than a snapshot's second never show as running: they show here.
      ["ended", "calls ended / s", (s) => s.tool_calls_ended_per_s],
    ],
    top: (s) => sum(Object.values(s.tool_cores)),
  },
};

const seen = []; // the snapshots of the last HISTORY_S, oldest first
let lastAt = 0;
let connection = null; // the open feed's AbortController

function sum(values) {
  return values.reduce((total, value) => total + value, 0);
}

function valueAt(snapshot, path) {
  return path.split(".").reduce((node, key) => (node == null ? undefined : node[key]), snapshot);
}

function timeAgo(seconds) {
  return seconds < 60 ? `${seconds} s` : `${seconds / 60} min`;
}

// Three digits, in the unit that keeps them out of exponent notation.
function formatSeconds(seconds) {
  const rounded = Number(seconds.toPrecision(3));
  if (rounded < 0.001) return `${(rounded * 1e6).toPrecision(3)} µs`;
  if (rounded < 1) return `${(rounded * 1000).toPrecision(3)} ms`;
  if (rounded < 1000) return `${rounded.toPrecision(3)} s`;
  return `${rounded.toFixed(0)} s`;
}

function formatted(path, value, unit) {
  if (path === "window" && value === null) return "none"; // the policy admits everyone
  if (value === undefined || value === null) return "–";
  if (unit === "s") return formatSeconds(value);
  return String(value);
}

// --- the numbers ---------------------------------------------------------------------

function showFields(snapshot) {
  for (const node of document.querySelectorAll("[data-field]")) {
    const path = node.dataset.field;
    const value = valueAt(snapshot, path);
    node.textContent = formatted(path, value, node.dataset.unit);
    node.title = typeof value === "number" && node.dataset.unit === "s" ? `${value} s` : "";
  }
}

function showCounts(snapshot) {
  for (const list of document.querySelectorAll("[data-counts]")) {
    const counts = snapshot[list.dataset.counts] ?? {};
    const items = Object.keys(counts)
      .sort()
      .map((key) => {
        const item = document.createElement("li");
        const count = document.createElement("b");
        count.dataset.field = `${list.dataset.counts}.${key}`;
        item.append(count, ` ${key}`);
        return item;
      });
    if (items.length === 0) items.push(Object.assign(document.createElement("li"), { textContent: "none yet" }));
    list.replaceChildren(...items);
  }
}

function showBars(snapshot) {
  for (const bar of document.querySelectorAll("[data-bar]")) {
    const parts = snapshot[bar.dataset.bar];
    const total = sum(Object.values(parts));
    for (const segment of bar.querySelectorAll("[data-segment]")) {
      const share = total > 0 ? (parts[segment.dataset.segment] ?? 0) / total : 0;
      segment.style.width = `${(share * 100).toFixed(2)}%`;
    }
    bar.title = total > 0 ? `${total} in all` : "unknown";
  }
}

// --- the charts ----------------------------------------------------------------------

function cssColour(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(`--${name}`).trim();
}

function niceCeiling(value) {
  const magnitude = 10 ** Math.floor(Math.log10(value));
  const step = [1, 2, 5, 10].find((factor) => factor * magnitude >= value);
  return step * magnitude;
}

function drawLegends() {
  for (const [name, chart] of Object.entries(CHARTS)) {
    const legend = document.querySelector(`[data-legend="${name}"]`);
    legend.replaceChildren(
      ...chart.series.map(([colour, label]) => {
        const item = document.createElement("li");
        item.textContent = label;
        item.style.setProperty("--swatch", cssColour(colour));
        return item;
      }),
    );
  }
}

function drawChart(canvas, chart) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = canvas.clientHeight;
  if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
  }
  const context = canvas.getContext("2d");
  context.setTransform(ratio, 0, 0, ratio, 0, 0);
  context.clearRect(0, 0, width, height);
  if (seen.length === 0) return;

  const frame = { left: 36, right: 8, top: 8, bottom: 18 };
  const plotWidth = width - frame.left - frame.right;
  const plotHeight = height - frame.top - frame.bottom;
  const now = seen[seen.length - 1].wall_s;
  const span = Math.min(HISTORY_S, Math.max(MIN_SPAN_S, now - seen[0].wall_s));
  const x = (wall) => frame.left + plotWidth * (1 - (now - wall) / span);
  let highest = 1;
  for (const snapshot of seen) {
    for (const [, , value] of chart.series) highest = Math.max(highest, value(snapshot) ?? 0);
    if (chart.top) highest = Math.max(highest, chart.top(snapshot));
  }
  const top = niceCeiling(highest);
  const y = (value) => frame.top + plotHeight * (1 - value / top);

  context.font = "11px system-ui, sans-serif";
  context.fillStyle = cssColour("dim");
  context.strokeStyle = cssColour("line");
  context.lineWidth = 1;
  context.textAlign = "right";
  context.textBaseline = "middle";
  for (let tick = 0; tick <= 4; tick += 1) {
    const value = (top * tick) / 4;
    context.beginPath();
    context.moveTo(frame.left, Math.round(y(value)) + 0.5);
    context.lineTo(width - frame.right, Math.round(y(value)) + 0.5);
    context.stroke();
    context.fillText(String(+value.toPrecision(3)), frame.left - 4, y(value));
  }
  context.textBaseline = "top";
  const step = TIME_STEPS_S.find((seconds) => span / seconds <= 6) ?? TIME_STEPS_S.at(-1);
  for (let ago = 0; ago < span - step / 2; ago += step) { // none on the value axis' labels
    context.textAlign = ago === 0 ? "right" : "center";
    context.fillText(ago === 0 ? "now" : `−${timeAgo(ago)}`, x(now - ago), height - frame.bottom + 4);
  }

  context.lineWidth = 2;
  context.lineJoin = "round";
  for (const [colour, , value] of chart.series) {
    context.strokeStyle = cssColour(colour);
    context.beginPath();
    let drawing = false;
    for (const snapshot of seen) {
      const v = value(snapshot);
      if (v === undefined || v === null) {
        drawing = false; // a gap: no window, cores unknown
        continue;
      }
      if (drawing) context.lineTo(x(snapshot.wall_s), y(v));
      else context.moveTo(x(snapshot.wall_s), y(v));
      drawing = true;
    }
    context.stroke();
  }
}

function drawCharts() {
  for (const [name, chart] of Object.entries(CHARTS)) {
    drawChart(document.querySelector(`[data-chart="${name}"]`), chart);
  }
}

// --- the feed ------------------------------------------------------------------------

function show(snapshot) {
  const previous = seen[seen.length - 1];
  const elapsed = previous ? snapshot.wall_s - previous.wall_s : 0;
  snapshot.tool_calls_ended_per_s =
    elapsed > 0 ? (snapshot.tool_calls_ended - previous.tool_calls_ended) / elapsed : 0;
  seen.push(snapshot);
  while (seen.length > 0 && seen[0].wall_s < snapshot.wall_s - HISTORY_S) seen.shift();
  lastAt = Date.now();
  showCounts(snapshot);
  showFields(snapshot);
  showBars(snapshot);
  drawCharts();
  document.title = `agentmars · ${snapshot.policy}`;
  setStatus("live", `live · ${new Date(snapshot.wall_s * 1000).toLocaleTimeString()}`);
}

function setStatus(state, text) {
  document.getElementById("status").dataset.state = state;
  document.getElementById("status-text").textContent = text;
}

// One SSE message's data (the lines after "data:"), or null for a comment.
function eventData(block) {
  const lines = block.split("\n").filter((line) => line.startsWith("data:"));
  return lines.length === 0 ? null : lines.map((line) => line.slice(5).replace(/^ /, "")).join("\n");
}

// Reads the feed until it ends; "refused" if the gateway refused the token.
async function readFeed(token) {
  connection = new AbortController();
  const response = await fetch(SNAPSHOTS, {
    headers: { Authorization: `Bearer ${token}` },
    cache: "no-store",
    signal: connection.signal,
  });
  if (response.status === 401) return "refused";
  if (!response.ok) throw new Error(`HTTP ${response.status}`);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return "ended";
    buffer += value; // the gateway ends its lines with \n alone
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const data = eventData(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
      if (data !== null) show(JSON.parse(data));
    }
  }
}

async function follow(token) {
  setStatus("connecting", "connecting…");
  for (;;) {
    let outcome;
    try {
      outcome = await readFeed(token);
    } catch (error) {
      outcome = error.name === "AbortError" ? "silent" : "lost";
    }
    if (outcome === "refused") {
      sessionStorage.removeItem(TOKEN_KEY);
      askForToken("The gateway refused this token.");
      return;
    }
    setStatus("reconnecting", `no feed (${outcome}); reconnecting…`);
    await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
  }
}

function watchFreshness() {
  setInterval(() => {
    if (connection === null || lastAt === 0) return;
    const age = Date.now() - lastAt;
    if (age > DEAD_MS) {
      lastAt = Date.now(); // one abort per silence
      connection.abort();
    } else if (age > STALE_MS && document.getElementById("status").dataset.state === "live") {
      setStatus("stale", `no snapshot for ${Math.round(age / 1000)} s`);
    }
  }, 1000);
}

// --- the token -----------------------------------------------------------------------

// A token travels in a header: printable ASCII without spaces (as the gateway checks it).
function usable(token) {
  return typeof token === "string" && /^[\x21-\x7e]+$/.test(token);
}

// The token of the URL's fragment (#token=...), kept for this tab and taken out of the
// address bar; else the one kept before.
function takeToken() {
  const given = new URLSearchParams(window.location.hash.slice(1)).get("token");
  if (given !== null) {
    window.history.replaceState(null, "", window.location.pathname + window.location.search);
    if (usable(given)) sessionStorage.setItem(TOKEN_KEY, given);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

function askForToken(reason) {
  setStatus("refused", "no token");
  const section = document.getElementById("token");
  if (reason) document.getElementById("token-reason").textContent = reason + " Enter the gateway's token:";
  section.hidden = false;
  document.getElementById("token-input").focus();
}

function start() {
  document.querySelector("[data-history-minutes]").textContent = String(HISTORY_S / 60);
  drawLegends();
  window.addEventListener("resize", drawCharts);
  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = document.getElementById("token-input").value.trim();
    if (!usable(token)) {
      askForToken("A token is printable ASCII without spaces.");
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    document.getElementById("token").hidden = true;
    follow(token);
  });
  watchFreshness();
  const token = takeToken();
  if (usable(token)) follow(token);
  else askForToken(null);
}

start();

// The Lambda platform console: plain JavaScript over the public /v1 API (no framework, no build step).
// Every value shown is an API answer; text from the API is set with textContent only.
// Elements that show a number carry it raw in data-value (and name it in data-field) for tests and tools.
"use strict";

const KEY_STORE = "lambda.console.apiKey";
const POLL_MS = 2000;
const HISTORY_MS = 5 * 60 * 1000; // the live charts show the last five minutes
const LIVE_TOP_MS = 3000; // a sliding view's top-N of the window ending now is asked again this often
const BASE = location.pathname.replace(/\/console\/?$/, "");
const history = {}; // pipeline -> [{t, lag, versions}]
const ingestSamples = []; // [{t, total}] of lambda_events_ingested_total
let timer = null;
let liveTimer = null; // the next refresh of a sliding view's live top-N

// ---- DOM -----------------------------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) if (value !== null && value !== undefined) el.setAttribute(name, String(value));
  for (const child of children.flat()) if (child !== null && child !== undefined) el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return el;
}

function num(field, value, suffix) {
  const shown = value === null || value === undefined ? "–" : (typeof value === "number" && !Number.isInteger(value) ? value.toFixed(2) : String(value));
  return h("span", { class: "num", "data-field": field, "data-value": value === null || value === undefined ? "" : value }, shown, suffix && value !== null && value !== undefined ? suffix : "");
}

function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function duration(seconds) {
  // 300 -> "5 m", 3600 -> "1 h", 5400 -> "1 h 30 m"
  const parts = [];
  let left = seconds;
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]]) {
    if (left >= size) { parts.push(`${Math.floor(left / size)} ${unit}`); left %= size; }
  }
  return parts.join(" ") || "0 s";
}

function windowKind(view) {
  // How a view's windows are laid out, from GET /v1/views: all time, tumbling, sliding (size every slide) or sessions.
  const text = view.session_gap_seconds ? `sessions, gap ${duration(view.session_gap_seconds)}`
    : !view.window_seconds ? "all time"
    : view.slide_seconds ? `sliding ${duration(view.window_seconds)} every ${duration(view.slide_seconds)}`
    : `tumbling ${duration(view.window_seconds)}`;
  return h("span", { "data-field": "window", "data-value": text }, text);
}

function problem(err) {
  const hint = err.status === 401 || err.status === 403 ? " Enter an API key with the right scope above." : "";
  return h("p", { class: "error", "data-field": "error", role: "alert" }, `${err.status ? err.status + " " : ""}${err.error || "Error"}: ${err.message}${hint}`);
}

// ---- API -----------------------------------------------------------------------------------------
function apiKey() { return sessionStorage.getItem(KEY_STORE) || ""; }

async function api(path, options = {}) {
  const headers = Object.assign({ Accept: "application/json" }, options.headers || {});
  if (apiKey()) headers.Authorization = "Bearer " + apiKey();
  const response = await fetch(BASE + path, Object.assign({}, options, { headers }));
  const text = await response.text();
  let body = text;
  try { body = JSON.parse(text); } catch (e) { /* metrics are text */ }
  if (!response.ok) {
    const err = new Error(body && body.detail ? body.detail : response.statusText);
    err.status = response.status;
    err.error = body && body.error;
    throw err;
  }
  return body;
}

const enc = encodeURIComponent;
function query(params) {
  const parts = Object.entries(params).filter(([, v]) => v !== "" && v !== null && v !== undefined).map(([k, v]) => `${enc(k)}=${enc(v)}`);
  return parts.length ? "?" + parts.join("&") : "";
}

function metricValue(text, name) {
  let total = null;
  for (const line of String(text).split("\n")) {
    if (line.startsWith(name + " ") || line.startsWith(name + "{")) total = (total || 0) + Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return total;
}

function metricLabel(text, name, label) {
  // The value of `label` on the first sample of `name` (Prometheus text: \\, \" and \n escaped), or null.
  const pattern = new RegExp(`[{,]${label}="((?:[^"\\\\]|\\\\.)*)"`);
  for (const line of String(text).split("\n")) {
    if (!line.startsWith(name + "{")) continue;
    const found = line.match(pattern);
    if (found) return found[1].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
  }
  return null;
}

function speedState(metrics) {
  // The speed layer as its metrics tell it: failing (with its last error and count), else its heartbeat.
  const beat = metricValue(metrics, "lambda_speed_heartbeat_age_seconds");
  if (metricValue(metrics, "lambda_part_failing") > 0) {
    return h("span", { class: "error", "data-field": "speed_state", "data-value": "failing" }, "FAILING: ",
      h("span", { "data-field": "speed_error" }, metricLabel(metrics, "lambda_part_last_error_info", "error") ?? "no error recorded"),
      " (failed ", num("speed_failures", metricValue(metrics, "lambda_part_failures")), " times since its last success",
      beat === null ? ")" : ["; heartbeat ", num("speed_heartbeat_age", beat, " s"), " ago)"]);
  }
  return beat === null ? h("span", { "data-field": "speed_state", "data-value": "never ran" }, "not running (no heartbeat)")
    : h("span", { "data-field": "speed_state", "data-value": "heartbeat" }, "heartbeat ", num("speed_heartbeat_age", beat, " s"), " ago");
}

function metricWhere(text, name, label, value) {
  // The sum of `name`'s samples whose `label` is `value` (a plain value: no escapes), or null when there are none.
  let total = null;
  for (const line of String(text).split("\n")) {
    if (line.startsWith(name + "{") && line.includes(`${label}="${value}"`)) total = (total || 0) + Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return total;
}

function kafkaState(metrics) {
  // The pipeline's Kafka ingest as its metrics tell it, or null when none ever reported (no Kafka configured).
  const up = metricValue(metrics, "lambda_kafka_ingest_up");
  if (up === null) return null;
  const records = outcome => metricWhere(metrics, "lambda_kafka_ingest_records_total", "outcome", outcome);
  return h("span", { "data-field": "kafka_state", "data-value": up > 0 ? "running" : "stopped" },
    up > 0 ? "running" : h("span", { class: "error" }, "not reporting"), " · ",
    num("kafka_appended", records("appended"), " appended"), " · ", num("kafka_dead_lettered", records("dead_lettered"), " dead letters"),
    " · lag ", num("kafka_lag", metricValue(metrics, "lambda_kafka_ingest_lag_records"), " records"));
}

// ---- charts --------------------------------------------------------------------------------------
function lineChart(points, { field, label, width = 560, height = 140, yUnit = "" }) {
  const pad = { l: 48, r: 8, t: 10, b: 22 };
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": label, "data-chart": field });
  if (!points.length) { svg.append(s("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "muted" }, "no data yet")); return svg; }
  const xs = points.map(p => p.x), ys = points.map(p => p.y);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y1 = Math.max(...ys, 0) || 1;
  const X = x => pad.l + (x - x0) / (x1 - x0) * (width - pad.l - pad.r);
  const Y = y => height - pad.b - y / y1 * (height - pad.t - pad.b);
  svg.append(s("line", { x1: pad.l, y1: Y(0), x2: width - pad.r, y2: Y(0), class: "axis" }));
  svg.append(s("text", { x: pad.l - 4, y: Y(y1) + 4, "text-anchor": "end", class: "tick" }, `${+y1.toFixed(2)}${yUnit}`));
  svg.append(s("text", { x: pad.l - 4, y: Y(0), "text-anchor": "end", class: "tick" }, `0${yUnit}`));
  svg.append(s("polyline", { points: points.map(p => `${X(p.x).toFixed(1)},${Y(p.y).toFixed(1)}`).join(" "), class: "line" }));
  for (const p of points) svg.append(s("circle", { cx: X(p.x).toFixed(1), cy: Y(p.y).toFixed(1), r: 2.5, class: "dot", "data-x": p.label ?? p.x, "data-value": p.y }, s("title", {}, `${p.label ?? p.x}: ${p.y}`)));
  if (points[0].label) {
    svg.append(s("text", { x: pad.l, y: height - 6, class: "tick" }, points[0].label));
    svg.append(s("text", { x: width - pad.r, y: height - 6, "text-anchor": "end", class: "tick" }, points[points.length - 1].label));
  }
  return svg;
}

function barChart(entries, { field, label }) {
  const width = 560, row = 22, labelW = 170, height = Math.max(row, entries.length * row);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": label, "data-chart": field });
  const top = Math.max(...entries.map(e => Number(e.value)), 0) || 1;
  entries.forEach((e, i) => {
    const w = Math.max(1, Number(e.value) / top * (width - labelW - 70));
    svg.append(s("g", { "data-key": e.key, "data-value": e.value },
      s("text", { x: labelW - 6, y: i * row + 15, "text-anchor": "end", class: "tick" }, e.key.length > 26 ? e.key.slice(0, 25) + "…" : e.key),
      s("rect", { x: labelW, y: i * row + 4, width: w.toFixed(1), height: row - 8, class: "bar" }),
      s("text", { x: labelW + w + 6, y: i * row + 15, class: "tick" }, String(e.value))));
  });
  return svg;
}

// ---- pages ---------------------------------------------------------------------------------------
async function pipelines() { return (await api("/v1/pipelines")).pipelines; }

function sample(pipeline, list) {
  const now = Date.now(), rows = history[pipeline] = (history[pipeline] || []).filter(p => now - p.t <= HISTORY_MS);
  rows.push({ t: now, lag: list.lag_seconds ?? 0, versions: list.lag_versions ?? 0 });
}

function ingestRate() {
  const [a, b] = [ingestSamples[0], ingestSamples[ingestSamples.length - 1]];
  if (!a || a === b || b.total === null || a.total === null) return null;
  return Math.max(0, (b.total - a.total) / ((b.t - a.t) / 1000));
}

async function overview(main) {
  const list = await pipelines();
  const metrics = await api("/metrics").catch(() => "");
  const total = metricValue(metrics, "lambda_events_ingested_total");
  ingestSamples.push({ t: Date.now(), total });
  while (ingestSamples.length > 2 && Date.now() - ingestSamples[0].t > 30000) ingestSamples.shift();
  const sections = [];
  for (const p of list) {
    let views, speed;
    try {
      views = await api(`${p.url}/views`);
      speed = await api(`${p.url}/metrics`).catch(() => "");
    } catch (err) { sections.push(h("section", { class: "card", "data-pipeline": p.name }, h("h2", {}, p.name), problem(err))); continue; }
    sample(p.name, views);
    const points = (history[p.name] || []).map(r => ({ x: r.t, y: r.lag, label: new Date(r.t).toISOString().slice(11, 19) }));
    sections.push(h("section", { class: "card", "data-pipeline": p.name },
      h("h2", {}, p.name, p.default ? h("span", { class: "badge" }, "default") : null,
        h("a", { class: "small", href: `#/pipelines/${enc(p.name)}/runs` }, "batch runs"),
        h("a", { class: "small", href: `#/pipelines/${enc(p.name)}/dead-letters` }, "dead letters")),
      h("dl", { class: "facts" },
        h("dt", {}, "served generation"), h("dd", {}, num("generation", p.generation)),
        h("dt", {}, "newest master version"), h("dd", {}, num("latest_version", views.latest_version)),
        h("dt", {}, "speed layer applied"), h("dd", {}, num("processed_version", views.processed_version)),
        h("dt", {}, "lag"), h("dd", {}, num("lag_versions", views.lag_versions, " versions"), " · ", num("lag_seconds", views.lag_seconds, " s")),
        h("dt", {}, "speed layer"), h("dd", {}, speedState(speed)),
        kafkaState(speed) === null ? null : [h("dt", {}, "kafka ingest"), h("dd", {}, kafkaState(speed))],
        h("dt", {}, "ingest (all pipelines)"), h("dd", {}, num("ingest_rate", ingestRate(), " events/s"), " · ", num("events_ingested", total, " events since start")),
        h("dt", {}, "logic"), h("dd", {}, h("code", { "data-field": "logic" }, views.served_logic ?? views.logic),
          views.pending_logic ? h("span", { class: "badge warn", "data-field": "pending_logic" }, `recomputing under ${views.pending_logic}`) : null)),
      h("h3", {}, "Freshness: lag of the merged answers, last five minutes (seconds)"),
      lineChart(points, { field: "lag", label: `lag of ${p.name} in seconds`, yUnit: "s" }),
      h("h3", {}, "Views"),
      h("table", {}, h("thead", {}, h("tr", {}, ["view", "keys", "window", "measures", "rows", "state"].map(c => h("th", {}, c)))),
        h("tbody", {}, views.views.map(v => h("tr", { "data-view": v.name },
          h("td", {}, h("a", { href: `#/pipelines/${enc(p.name)}/views/${enc(v.name)}` }, v.name)),
          h("td", {}, v.keys.join(", ")), h("td", {}, windowKind(v)),
          h("td", {}, v.measures.map(m => m.name).join(", ")), h("td", {}, num("rows", v.rows)),
          h("td", {}, v.pending ? h("span", { class: "badge warn" }, "pending") : v.generation === null ? "not served" : "served")))))));
  }
  main.replaceChildren(h("h1", {}, "Overview"), ...sections);
}

async function viewPage(main, pipelineName, viewName, params) {
  const p = (await pipelines()).find(x => x.name === pipelineName);
  if (!p) throw Object.assign(new Error(`no pipeline ${pipelineName}`), { status: 404, error: "NotFoundError" });
  const list = await api(`${p.url}/views`);
  const view = list.views.find(v => v.name === viewName);
  if (!view) throw Object.assign(new Error(`no view ${viewName} in ${pipelineName}; it has ${list.views.map(v => v.name).join(", ")}`), { status: 404, error: "NotFoundError" });
  const base = `${p.url}/views/${enc(view.name)}`;
  const measures = [...view.measures.map(m => m.name), ...view.derived];
  const go = changes => { location.hash = `#/pipelines/${enc(p.name)}/views/${enc(view.name)}` + query(Object.assign({}, params, changes)); };
  const field = (name, label, value, attrs = {}) => h("label", {}, label, h("input", Object.assign({ name, value: value ?? "" }, attrs)));
  const form = (id, onsubmit, ...children) => h("form", { id, onsubmit: e => { e.preventDefault(); onsubmit(Object.fromEntries(new FormData(e.target))); } }, ...children, h("button", { type: "submit" }, "Show"));

  const definition = h("section", { class: "card" }, h("h2", {}, view.name, view.pending ? h("span", { class: "badge warn" }, "pending") : null),
    h("p", {}, view.description),
    h("dl", { class: "facts" }, h("dt", {}, "keys"), h("dd", {}, view.keys.join(", ")),
      h("dt", {}, "measures"), h("dd", {}, view.measures.map(m => `${m.name} (${m.kind}${m.column ? " of " + m.column : ""})`).join(", ")),
      h("dt", {}, "derived"), h("dd", {}, view.derived.join(", ") || "–"),
      h("dt", {}, "window"), h("dd", {}, windowKind(view)),
      h("dt", {}, "rows served"), h("dd", {}, num("rows", view.rows)),
      h("dt", {}, "generation"), h("dd", {}, num("generation", view.generation)),
      h("dt", {}, "exact through version"), h("dd", {}, num("version", view.version))));

  if (view.session_gap_seconds) {
    main.replaceChildren(h("p", {}, h("a", { href: "#/" }, "overview"), " / ", p.name, " / ", view.name), definition,
      ...await sessionCards(base, params, go, field, form, view));
    return;
  }
  const windowed = Boolean(view.window_seconds), ranged = Boolean(params.from && params.to);
  const needRange = what => h("p", { class: "muted hint" }, `This view is windowed (${windowKind(view).textContent}): give a range above to ${what}.`);
  const rangeCard = windowed ? h("section", { class: "card", id: "range" }, h("h2", {}, "Range"),
    form("range-form", v => go({ from: v.from, to: v.to, window_start: "", cursor: "" }),
      field("from", "from ", params.from, { placeholder: "2024-03-01T09:00:00Z or epoch s" }),
      field("to", "to ", params.to, { placeholder: "2024-03-02T00:00:00Z" })),
    h("p", { class: "muted small" }, "Times are ISO 8601 (UTC when no offset) or epoch seconds; top ranks the window starting at 'from' unless a window start is given.")) : null;
  const measure = params.measure || measures[0];
  const topCard = h("section", { class: "card", id: "top" }, h("h2", {}, "Top keys"),
    form("top-form", v => go({ n: v.n, measure: v.measure, window_start: v.window_start }),
      h("label", {}, "by ", h("select", { name: "measure" }, measures.map(m => h("option", { value: m, selected: m === measure }, m)))),
      field("n", "n ", params.n || 10, { type: "number", min: 1, max: 1000 }),
      view.window_seconds ? field("window_start", "window start ", params.window_start, { placeholder: "2024-03-01T09:00:00Z" }) : null));
  const liveCard = view.slide_seconds ? h("section", { class: "card", id: "live-top" }, h("h2", {}, "Top keys, window ending now"),
    h("div", { class: "live" }), h("p", { class: "muted small" }, `Asked again every ${LIVE_TOP_MS / 1000} s.`)) : null;
  const cards = [definition, rangeCard, liveCard, topCard].filter(Boolean);
  const windowStart = params.window_start || params.from;
  if (windowed && !windowStart) topCard.append(needRange("rank keys in a window"));
  else try {
    const top = await api(`${base}/top` + query({ n: params.n || 10, measure, window_start: windowStart }));
    topCard.append(h("p", { class: "muted" }, "exact for version ", num("top.version", top.version)),
      top.top.length ? barChart(top.top, { field: "top", label: `top ${top.n} by ${top.measure}` }) : h("p", { class: "muted" }, "no keys"));
  } catch (err) { topCard.append(problem(err)); }

  const keyCard = h("section", { class: "card", id: "key" }, h("h2", {}, "One key"),
    form("key-form", v => go({ key: v.key }),
      field("key", "key ", params.key, { placeholder: view.keys.length > 1 ? view.keys.join("|") : view.keys[0], size: 30 })));
  cards.push(keyCard);
  if (params.key && windowed && !ranged) keyCard.append(needRange("chart this key per window"));
  else if (params.key) await keyDetails(keyCard, base, params, measures, measure, view);

  const keysCard = h("section", { class: "card", id: "keys" }, h("h2", {}, "Keys"),
    form("keys-form", v => go({ prefix: v.prefix, cursor: "" }), field("prefix", "prefix ", params.prefix)));
  cards.push(keysCard);
  if (windowed && !ranged) keysCard.append(needRange("list its keys"));
  else try {
    const page = await api(`${base}/keys` + query({ limit: 20, prefix: params.prefix, cursor: params.cursor, from: params.from, to: params.to }));
    keysCard.append(h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "key"), view.window_seconds ? h("th", {}, "window") : null, measures.map(m => h("th", {}, m)))),
      h("tbody", {}, page.keys.map(k => h("tr", { "data-key": k.key },
        h("td", {}, h("a", { href: `#/pipelines/${enc(p.name)}/views/${enc(view.name)}` + query({ key: k.key, from: params.from, to: params.to }) }, k.key)),
        view.window_seconds ? h("td", {}, when(k.window && k.window.start)) : null,
        measures.map(m => h("td", {}, num(`keys.${m}`, k.value[m]))))))),
      page.next_cursor ? h("button", { id: "keys-next", onclick: () => go({ cursor: page.next_cursor }) }, "next page") : h("p", { class: "muted" }, "last page"));
  } catch (err) { keysCard.append(problem(err)); }
  main.replaceChildren(h("p", {}, h("a", { href: "#/" }, "overview"), " / ", p.name, " / ", view.name), ...cards);
  if (liveCard) await liveTop(liveCard, base, measure, params.n || 10);
}

async function liveTop(card, base, measure, n) {
  // The top-N of the sliding window ending now as a bar chart, asked again every LIVE_TOP_MS while the card is shown.
  clearTimeout(liveTimer);
  let shown;
  try {
    const top = await api(`${base}/top` + query({ n, measure, window_end: "now" }));
    shown = [h("p", { class: "muted" }, "window ", h("span", { "data-field": "live.window_start", "data-value": top.window.start }, when(top.window.start)),
      " to ", h("span", { "data-field": "live.window_end", "data-value": top.window.end }, when(top.window.end)),
      " · exact for version ", num("live.version", top.version)),
      top.top.length ? barChart(top.top, { field: "live-top", label: `top ${top.n} by ${top.measure}, window ending now` }) : h("p", { class: "muted" }, "no keys in this window")];
  } catch (err) { shown = [problem(err)]; }
  if (!card.isConnected) return;
  card.querySelector(".live").replaceChildren(...shown);
  card.dataset.refreshes = String(Number(card.dataset.refreshes || 0) + 1);
  liveTimer = setTimeout(() => liveTop(card, base, measure, n), LIVE_TOP_MS);
}

async function keyDetails(card, base, params, measures, measure, view) {
  try {
    const answer = await api(`${base}/keys/${enc(params.key)}` + query(view.window_seconds ? { from: params.from, to: params.to } : { explain: "true" }));
    card.append(h("p", { class: "muted" }, "generation ", num("key.generation", answer.generation), ", exact for version ", num("key.version", answer.version)));
    if (answer.windows) {
      const points = answer.windows.map(w => ({ x: Date.parse(w.start), y: Number(w.value[measure] ?? 0), label: when(w.start) }));
      card.append(h("h3", {}, `${measure} per window`), lineChart(points, { field: "windows", label: `${measure} of ${params.key} per window` }));
      return;
    }
    const parts = answer.explain || {};
    const names = [...new Set([...Object.keys(answer.value), ...Object.keys(parts.batch || {}), ...Object.keys(parts.realtime || {})])];
    const cell = (part, m, v) => h("td", { "data-part": part }, v === undefined ? "–" : num(`${part}.${m}`, typeof v === "object" ? JSON.stringify(v) : v));
    card.append(h("table", { id: "explain" }, h("thead", {}, h("tr", {}, h("th", {}, "measure"), h("th", {}, `batch (generation ${parts.generation ?? "–"}, through version ${parts.generation_version ?? "–"})`),
      h("th", {}, `realtime (through version ${parts.speed_processed_version ?? "–"})`), h("th", {}, "merged answer"))),
      h("tbody", {}, names.map(m => h("tr", { "data-measure": m }, h("td", {}, m), cell("batch", m, (parts.batch || {})[m]), cell("realtime", m, (parts.realtime || {})[m]), cell("value", m, answer.value[m]))))));
  } catch (err) { card.append(problem(err)); }
}

async function runsPage(main, pipelineName) {
  const p = (await pipelines()).find(x => x.name === pipelineName);
  if (!p) throw Object.assign(new Error(`no pipeline ${pipelineName}`), { status: 404, error: "NotFoundError" });
  const list = await api(`${p.url}/batch/runs`);
  const outcome = h("div", { id: "run-outcome", "data-field": "run.outcome" });
  const force = h("input", { type: "checkbox", id: "run-force" });
  const start = h("button", { id: "run-start", onclick: async () => {
    start.disabled = true;
    try {
      const run = await api(`${p.url}/batch/runs`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ force: force.checked }) });
      outcome.replaceChildren(`run ${run.id} ${run.status}`);
      outcome.dataset.runId = run.id;
    } catch (err) { outcome.replaceChildren(problem(err)); }
    start.disabled = false;
  } }, "Start a batch run");
  const longest = Math.max(1, ...list.runs.map(r => r.duration_seconds || 0));
  const runs = list.runs.map(r => h("li", { class: `run ${r.status}`, "data-run-id": r.id, "data-run-status": r.status },
    h("div", { class: "run-head" }, h("span", { class: `badge ${r.status}` }, r.status), " ", h("code", {}, r.id), ` ${r.trigger}${r.force ? ", forced" : ""} · asked ${when(r.requested_at)}`,
      r.finished_at ? ` · ${(r.duration_seconds ?? 0).toFixed(1)} s` : r.started_at ? ` · running since ${when(r.started_at)}` : " · waiting for a scheduler"),
    h("div", { class: "timeline", "data-width": Math.max(8, (r.duration_seconds ?? longest) / longest * 100).toFixed(1) }, (r.stages || []).map(st => h("span", {
      class: `stage ${st.seconds === null ? "running" : ""}`, style: null, "data-stage": st.name,
      title: `${st.name}${st.view ? " " + st.view : ""}: ${st.seconds === null ? "running" : st.seconds.toFixed(2) + " s"}${st.count !== null ? `, ${st.count} ${st.unit}` : ""}`,
      "data-width": Math.max(2, (st.seconds || 0) / longest * 100).toFixed(1) }, `${st.name}${st.view ? " " + st.view : ""}${st.count !== null ? ` (${st.count} ${st.unit})` : ""}`))),
    h("div", { class: "small" }, r.generation !== null && r.generation !== undefined ? ["generation ", num("run.generation", r.generation), r.served === false ? " (not flipped: a newer one was)" : ""] : null,
      r.events !== null && r.events !== undefined ? [" · ", num("run.events", r.events), " events"] : null,
      r.skip_reason ? ` · skipped: ${r.skip_reason}` : null),
    r.error ? h("pre", { class: "error" }, r.error) : null));
  main.replaceChildren(h("p", {}, h("a", { href: "#/" }, "overview"), " / ", p.name, " / batch runs"),
    h("section", { class: "card" }, h("h2", {}, "Batch runs of ", p.name),
      h("p", {}, list.schedulers.length ? `${list.schedulers.length} scheduler(s): ${list.schedulers.map(x => `${x.schedule || "on demand"}, next ${when(x.next_run_at)}`).join("; ")}`
        : "no scheduler running: a queued run waits until one starts (lambda-platform batch schedule)"),
      list.schedulers.filter(x => x.upkeep).map(x => h("p", { class: "small", "data-field": "upkeep" }, `Upkeep of the master dataset: ${x.upkeep}`)),
      h("p", {}, start, " ", h("label", {}, force, " force (recompute even if nothing changed)"), " — needs a key with the admin scope"), outcome,
      h("ol", { class: "runs", id: "runs" }, runs.length ? runs : h("li", { class: "muted" }, "no runs yet"))));
  // Widths through the CSSOM (the page's policy allows no inline style): a run's bar is as long as
  // its duration against the longest run's, each stage as long as its share of it.
  for (const bar of main.querySelectorAll(".timeline[data-width]")) bar.style.width = bar.dataset.width + "%";
  for (const bar of main.querySelectorAll(".stage[data-width]")) bar.style.flexGrow = bar.dataset.width;
}

// The newest records ingest refused and kept (GET .../dead-letters), newest first; replay is a command.
async function deadLettersPage(main, pipelineName) {
  const p = (await pipelines()).find(x => x.name === pipelineName);
  if (!p) throw Object.assign(new Error(`no pipeline ${pipelineName}`), { status: 404, error: "NotFoundError" });
  const list = await api(`${p.url}/dead-letters${query({ order: "newest", limit: 50 })}`);
  const where = l => l.file !== null ? `${l.file.split("/").pop()}:${l.line ?? ""}` : l.topic !== null ? `${l.topic}[${l.partition}]@${l.offset}` : "";
  const cut = text => text.length > 160 ? text.slice(0, 159) + "…" : text;
  const rows = list.letters.map(l => h("tr", { "data-letter-id": l.id, "data-source": l.source },
    h("td", {}, when(l.dead_at)), h("td", {}, l.source), h("td", { title: l.file ?? "" }, where(l)), h("td", {}, l.field ?? ""),
    h("td", {}, l.reason), h("td", {}, h("code", { title: l.raw }, cut(l.raw))),
    h("td", {}, l.replayed ? h("span", { class: "badge succeeded" }, "replayed") : "")));
  main.replaceChildren(h("p", {}, h("a", { href: "#/" }, "overview"), " / ", p.name, " / dead letters"),
    h("section", { class: "card" }, h("h2", {}, "Dead letters of ", p.name),
      h("p", {}, num("dead_letters.total", list.total), " records refused and kept", list.total > list.letters.length ? `; the newest ${list.letters.length} below` : "",
        ". After fixing the event model or the data, ", h("code", {}, "lambda-platform dead-letters replay"), " appends the ones valid now, once each."),
      rows.length ? h("table", { id: "dead-letters" }, h("thead", {}, h("tr", {}, ["refused at", "source", "where", "field", "reason", "raw", ""].map(c => h("th", {}, c)))),
        h("tbody", {}, rows)) : h("p", { class: "muted" }, "no dead letters")));
}

// ---- router --------------------------------------------------------------------------------------
function route() {
  const [path, search] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const params = Object.fromEntries(new URLSearchParams(search || ""));
  if (parts[0] === "pipelines" && parts[2] === "views" && parts[3]) return { name: "view", render: m => viewPage(m, parts[1], parts[3], params), live: false };
  if (parts[0] === "pipelines" && parts[2] === "runs") return { name: "runs", render: m => runsPage(m, parts[1]), live: true };
  if (parts[0] === "pipelines" && parts[2] === "dead-letters") return { name: "dead-letters", render: m => deadLettersPage(m, parts[1]), live: true };
  return { name: "overview", render: overview, live: true };
}

async function show() {
  clearTimeout(timer);
  clearTimeout(liveTimer);
  const main = document.getElementById("main");
  const page = route();
  document.body.dataset.page = page.name;
  delete document.body.dataset.loaded;
  try {
    await page.render(main);
    document.body.dataset.loaded = page.name;
  } catch (err) {
    main.replaceChildren(problem(err));
    document.body.dataset.loaded = "error";
  }
  if (page.live) timer = setTimeout(show, POLL_MS);
}

async function nav() {
  const links = [h("a", { href: "#/" }, "Overview")];
  try { for (const p of await pipelines()) links.push(h("a", { href: `#/pipelines/${enc(p.name)}/runs` }, `${p.name}: runs`)); } catch (err) { /* shown by the page */ }
  document.getElementById("nav").replaceChildren(...links);
}

function authForm() {
  const input = document.getElementById("api-key"), state = document.getElementById("api-key-state");
  const refresh = () => { state.textContent = apiKey() ? "key in use (this tab only)" : "no key"; };
  document.getElementById("auth").addEventListener("submit", e => { e.preventDefault(); sessionStorage.setItem(KEY_STORE, input.value.trim()); input.value = ""; refresh(); nav(); show(); });
  document.getElementById("api-key-forget").addEventListener("click", () => { sessionStorage.removeItem(KEY_STORE); refresh(); nav(); show(); });
  refresh();
}

window.addEventListener("hashchange", show);
window.addEventListener("DOMContentLoaded", () => { authForm(); nav(); show(); });

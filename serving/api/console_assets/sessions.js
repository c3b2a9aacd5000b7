// The console's session-view cards: the top keys by session count or longest session, and one key's sessions as a
// timeline (and a table). Loaded after console.js, whose helpers (h, s, num, when, duration, api, query, enc,
// barChart, problem) it uses; plain JavaScript and SVG, as the rest of the console.
"use strict";

async function sessionCards(base, params, go, field, form, view) {
  // A session view: the top keys by session count or longest session, and one key's sessions, over an optional range.
  const range = { from: params.from, to: params.to }, by = params.by || "count";
  const topCard = h("section", { class: "card", id: "top" }, h("h2", {}, "Top keys by sessions"),
    form("top-form", v => go({ by: v.by, n: v.n, from: v.from, to: v.to }),
      h("label", {}, "by ", h("select", { name: "by" }, ["count", "longest"].map(b => h("option", { value: b, selected: b === by }, b)))),
      field("n", "n ", params.n || 10, { type: "number", min: 1, max: 1000 }),
      field("from", "from ", params.from, { placeholder: "all time (or -1h, a time)" }), field("to", "to ", params.to, { placeholder: "now" })));
  try {
    const top = await api(`${base}/sessions/top` + query({ by, n: params.n || 10, ...range }));
    topCard.append(h("p", { class: "muted" }, "exact for version ", num("top.version", top.version)),
      top.top.length ? barChart(top.top, { field: "top", label: `top ${top.n} by session ${by}` }) : h("p", { class: "muted" }, "no keys"));
  } catch (err) { topCard.append(problem(err)); }
  const keyCard = h("section", { class: "card", id: "key" }, h("h2", {}, "One key's sessions"),
    form("key-form", v => go({ key: v.key }), field("key", "key ", params.key, { placeholder: view.keys.join("|"), size: 30 })));
  if (params.key) try {
    const got = await api(`${base}/sessions/keys/${enc(params.key)}` + query(range));
    keyCard.append(h("p", { class: "muted" }, got.exact ? "exact for version " : "NOT exact (folded sessions touch the range) at version ",
      num("key.version", got.version), got.folded ? [" · folded: ", num("key.folded", got.folded.sessions)] : ""),
      sessionTimeline(got, { field: "sessions", label: `sessions of ${params.key}` }), sessionTable(got));
  } catch (err) { keyCard.append(problem(err)); }
  return [topCard, keyCard];
}

function sessionTable(got) {
  // The same sessions as rows: what a screen reader or a copy-paste reads.
  const measures = got.sessions.length ? Object.keys(got.sessions[0].value) : [];
  return h("table", { id: "session-table" }, h("caption", { class: "muted small" }, "Sessions, oldest first"),
    h("thead", {}, h("tr", {}, ["start", "end", "duration s", ...measures].map(c => h("th", {}, c)))),
    h("tbody", {}, got.sessions.map(x => h("tr", { "data-session": x.session_start },
      h("td", {}, when(x.session_start)), h("td", {}, when(x.session_end)), h("td", {}, num("session.duration", x.duration)),
      measures.map(m => h("td", {}, num(`session.${m}`, x.value[m])))))));
}

function timelineSpan(got) {
  // The axis in epoch ms: the range asked, or (all time) from the first session, folded ones included, to the last.
  if (got.range) return [Date.parse(got.range.start), Date.parse(got.range.end)];
  const f = got.folded || {};
  const starts = [...got.sessions.map(x => x.session_start), f.first_start].filter(Boolean).map(Date.parse);
  const ends = [...got.sessions.map(x => x.session_end), f.last_end].filter(Boolean).map(Date.parse);
  if (!starts.length || !ends.length) return [Date.now() - 60000, Date.now()]; // nothing dated: the last minute
  const x0 = Math.min(...starts), x1 = Math.max(...ends);
  return x1 > x0 ? [x0, x1] : [x0 - 30000, x0 + 30000]; // one instant: the minute around it
}

function sessionTimeline(got, { field, label }) {
  // One bar per session from its start to its end on the range's axis (cut at its ends: a session is answered whole
  // when it overlaps the range); a dashed marker where the folded (older) sessions lie, at the left edge when before it.
  // Each bar carries the session raw: data-start, data-end (as the API answers them), data-duration, data-values (JSON).
  const width = 560, height = 70, pad = { l: 10, r: 10 }, top = 16, barH = 20;
  if (!got.sessions.length && !got.folded) return h("p", { class: "muted" }, "no sessions in this range");
  const [x0, x1] = timelineSpan(got);
  const X = t => pad.l + (Math.min(Math.max(t, x0), x1) - x0) / (x1 - x0) * (width - pad.l - pad.r);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "data-chart": field,
    "aria-label": `${label}: ${got.sessions.length} sessions${got.folded ? `, ${got.folded.sessions} older folded into a summary` : ""} (the table below lists them)`,
    "data-from": new Date(x0).toISOString(), "data-to": new Date(x1).toISOString() });
  svg.append(s("line", { x1: pad.l, y1: top + barH + 4, x2: width - pad.r, y2: top + barH + 4, class: "axis" }),
    s("text", { x: pad.l, y: height - 6, class: "tick" }, when(new Date(x0).toISOString())),
    s("text", { x: width - pad.r, y: height - 6, "text-anchor": "end", class: "tick" }, when(new Date(x1).toISOString())));
  const f = got.folded;
  if (f) {
    const a = f.first_start ? X(Date.parse(f.first_start)) : pad.l, b = f.last_end ? X(Date.parse(f.last_end)) : a;
    svg.append(s("g", { class: "folded", "data-folded": f.sessions, "data-start": f.first_start, "data-end": f.last_end },
      s("rect", { x: a.toFixed(1), y: top - 4, width: Math.max(4, b - a).toFixed(1), height: barH + 8, class: "folded-span" }),
      s("text", { x: a.toFixed(1), y: top - 6, class: "tick" }, `${f.sessions} folded`),
      s("title", {}, `${f.sessions} older sessions folded into one summary (${when(f.first_start)} to ${when(f.last_end)}, longest ${duration(Math.round(f.longest))}): no longer shown one by one`)));
  }
  for (const x of got.sessions) {
    const a = X(Date.parse(x.session_start)), b = X(Date.parse(x.session_end));
    const values = Object.entries(x.value).map(([m, v]) => `${m} ${v}`).join(", ");
    svg.append(s("g", { class: "session", "data-start": x.session_start, "data-end": x.session_end, "data-duration": x.duration,
      "data-values": JSON.stringify(x.value) },
      s("rect", { x: a.toFixed(1), y: top, width: Math.max(4, b - a).toFixed(1), height: barH, class: "bar" }),
      s("title", {}, `${when(x.session_start)} to ${when(x.session_end)}: ${duration(Math.round(x.duration))} (${x.duration} s); ${values}`)));
  }
  return svg;
}

// The dynarl dashboard's page: polls the server's JSON views of the run directory
// (launch/dashboard/feed.py) and draws them. Curves are uPlot charts (vendored:
// uPlot.iife.min.js); the step views are plain SVG. Every drawn number is also in the
// DOM (a chart's data-x / data-series, a bar's data-* attributes) for tests to read.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token") || "";
const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"];
const STAGE_ORDER = ["rollout", "reward", "inference", "critic", "env", "trainer", "sync"];
const LEFT = 120; // the step views' row labels: their time axes line up

const state = { colours: {}, loaded: null, charts: {}, step: null, follow: true, samplesKey: null, samplesAsked: 0 };

async function get(view, params = {}) {
  const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== null && v !== ""));
  const response = await fetch(`/api/${view}?${query}`, { headers: { Authorization: `Bearer ${TOKEN}` } });
  if (!response.ok) throw new Error(`${view}: HTTP ${response.status}`);
  return response.json();
}

function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

function colour(component) {
  return state.colours[component] || "#937860";
}

function fmt(x, digits = 3) {
  return x === null || x === undefined ? "-" : Number(x).toFixed(digits);
}

// --- the run ------------------------------------------------------------------------

async function refresh() {
  const summary = await get("summary");
  state.colours = summary.colours;
  document.getElementById("run-dir").textContent = summary.run_dir;
  const badge = document.getElementById("run-status");
  badge.textContent = summary.running ? "running" : "not running";
  badge.classList.toggle("running", summary.running);
  document.getElementById("run-progress").textContent =
    `step ${summary.steps_done}/${summary.steps_total ?? "?"} · ${summary.workflow ?? "?"} · scheduler ${summary.scheduler ?? "?"}`;
  if (summary.last_time) {
    document.getElementById("run-updated").textContent =
      `last step at ${new Date(summary.last_time * 1000).toLocaleTimeString()}`;
  }
  const key = `${summary.steps_done}:${summary.last_time}`;
  if (key !== state.loaded) {
    await Promise.all([drawCurves(), drawMigrations(), drawStep(), drawSamples(true)]);
    state.loaded = key;
    document.body.dataset.loaded = String(summary.steps_done);
  }
  return summary.running;
}

async function poll() {
  let running = true;
  try {
    running = await refresh();
  } catch (err) {
    document.getElementById("run-updated").textContent = `(${err.message}; retrying)`;
  }
  setTimeout(poll, running ? POLL_MS : 5 * POLL_MS);
}

// --- curves -------------------------------------------------------------------------

async function drawCurves() {
  const charts = await get("curves");
  const box = document.getElementById("curves");
  for (const chart of charts) {
    let holder = document.getElementById(`chart-${chart.id}`);
    if (!holder) {
      holder = el("div", { id: `chart-${chart.id}`, class: "chart" });
      box.appendChild(holder);
    }
    const series = Object.fromEntries(chart.series.map((s) => [s.key, s.values]));
    holder.dataset.x = JSON.stringify(chart.x);
    holder.dataset.series = JSON.stringify(series);
    const data = [chart.x, ...chart.series.map((s) => s.values)];
    const shape = chart.series.map((s) => s.key).join(",");
    const existing = state.charts[chart.id];
    if (existing && existing.shape === shape) {
      existing.plot.setData(data);
      continue;
    }
    if (existing) existing.plot.destroy();
    const plot = new uPlot({
      title: chart.title,
      width: Math.max(holder.clientWidth, 400),
      height: 220,
      // a flat series (KL 0 where it is not computed) gets a narrow range, not uPlot's 0-100
      scales: { x: { time: false }, y: { range: (u, lo, hi) => (lo === hi ? [lo - 1, hi + 1] : uPlot.rangeNum(lo, hi, 0.1, true)) } },
      axes: [{ label: "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000] }, {}],
      series: [{ label: "step" }, ...chart.series.map((s, i) => ({
        label: s.label, stroke: state.colours[s.label] || PALETTE[i % PALETTE.length],
        width: 2, spanGaps: true, points: { show: chart.x.length < 60 },
      }))],
    }, data, holder);
    holder.uplot = plot;
    state.charts[chart.id] = { plot, shape };
  }
}

// --- a step: device ownership, device counts, stage timeline -------------------------

async function drawStep() {
  const select = document.getElementById("step-select");
  const step = state.follow ? null : state.step;
  const view = await get("step", { step });
  if (!view) return;
  state.step = view.step;
  const shown = view.steps.map(String);
  if ([...select.options].map((o) => o.value).join() !== shown.join()) {
    select.replaceChildren(...view.steps.map((n) => el("option", { value: n }, `${n + 1}`)));
  }
  select.value = String(view.step);
  drawOwnership(view);
  drawCounts(view);
  drawStages(view);
}

function timeScale(view, width, left) {
  const span = Math.max(view.duration_s, 1e-6);
  return (t) => left + (Math.max(0, Math.min(t, span)) / span) * (width - left - 30);
}

function timeAxis(root, x, view, y) {
  const ticks = 8;
  for (let i = 0; i <= ticks; i++) {
    const t = (view.duration_s * i) / ticks;
    root.appendChild(svg("line", { x1: x(t), x2: x(t), y1: y, y2: y + 4, stroke: "#999" }));
    root.appendChild(svg("text", { x: x(t), y: y + 15, "text-anchor": "middle" }, `${t.toFixed(2)}`));
  }
}

function drawOwnership(view) {
  const width = document.getElementById("ownership").clientWidth || 1000;
  const left = LEFT, rowH = 26, top = 28;
  const rows = [...Array(view.devices).keys()].map((d) => `device ${d}`).concat(["cpu"]);
  const height = top + rows.length * rowH + 30;
  const x = timeScale(view, width, left);
  const root = svg("svg", { width, height, id: "ownership-svg", "data-step": view.step });
  rows.forEach((name, i) => {
    root.appendChild(svg("text", { x: 4, y: top + i * rowH + rowH / 2 + 4 }, name));
    root.appendChild(svg("line", { x1: left, x2: width - 30, y1: top + (i + 1) * rowH, y2: top + (i + 1) * rowH,
      stroke: "#eee" }));
  });
  const used = new Set();
  for (const s of view.spans) {
    used.add(s.component);
    for (const d of s.devices.length ? s.devices : [view.devices]) {
      const rect = svg("rect", {
        x: x(s.start), y: top + d * rowH + 3, width: Math.max(x(s.end) - x(s.start), 1), height: rowH - 6,
        fill: colour(s.component), class: "own",
        "data-component": s.component, "data-device": s.devices.length ? d : "cpu",
        "data-start": s.start, "data-end": s.end, "data-label": s.label,
      });
      rect.appendChild(svg("title", {}, `${s.component} (${s.label}) on ${rows[d]}: ${fmt(s.start, 2)}-${fmt(s.end, 2)} s`));
      root.appendChild(rect);
    }
  }
  const bottom = top + rows.length * rowH;
  view.moves.forEach((m, i) => {
    const line = svg("line", { x1: x(m.at), x2: x(m.at), y1: top - 4, y2: bottom, class: "move", "data-at": m.at,
      "data-text": m.text });
    line.appendChild(svg("title", {}, `move ${m.text}: predicted ${fmt(m.predicted_s, 2)} s vs ${fmt(m.current_s, 2)} s unmoved`));
    root.appendChild(line);
    root.appendChild(svg("text", { x: x(m.at) + 3, y: 10 + (i % 2) * 11, class: "move-label" }, m.text));
  });
  timeAxis(root, x, view, bottom);
  document.getElementById("ownership").replaceChildren(root);
  document.getElementById("legend").replaceChildren(...[...used].sort().map((c) => {
    const item = el("span", {}, c);
    item.style.setProperty("--swatch", colour(c));
    return item;
  }));
}

function drawCounts(view) {
  const box = document.getElementById("counts");
  if (!view.counts.length) {
    box.replaceChildren();
    return;
  }
  const width = box.clientWidth || 1000;
  const left = LEFT, top = 10, height = 120;
  const x = timeScale(view, width, left);
  const components = [...new Set(view.counts.flatMap((c) => Object.keys(c.counts)))].sort();
  const most = Math.max(1, ...view.counts.flatMap((c) => Object.values(c.counts)));
  const y = (n) => top + (1 - n / most) * (height - top - 20);
  const root = svg("svg", { width, height, id: "counts-svg" });
  root.appendChild(svg("text", { x: 4, y: y(most) + 4 }, `${most} devices`));
  root.appendChild(svg("text", { x: 4, y: y(0) + 4 }, "0"));
  root.appendChild(svg("text", { x: 4, y: (y(most) + y(0)) / 2 + 4, class: "muted" }, "held"));
  for (const c of components) {
    const points = [];
    view.counts.forEach((sample, i) => {
      const n = sample.counts[c] ?? 0;
      const next = i + 1 < view.counts.length ? view.counts[i + 1].at : view.duration_s;
      points.push(`${x(sample.at)},${y(n)}`, `${x(next)},${y(n)}`);
    });
    root.appendChild(svg("polyline", { points: points.join(" "), fill: "none", stroke: colour(c), "stroke-width": 2,
      class: "count", "data-component": c, "data-counts": JSON.stringify(view.counts.map((s) => s.counts[c] ?? 0)) }));
  }
  box.replaceChildren(root);
}

function drawStages(view) {
  const width = document.getElementById("stages").clientWidth || 1000;
  const left = LEFT, rowH = 22, top = 6;
  const present = [...new Set(view.spans.map((s) => s.component))];
  const rows = STAGE_ORDER.filter((c) => present.includes(c)).concat(present.filter((c) => !STAGE_ORDER.includes(c)).sort());
  const height = top + rows.length * rowH + 30;
  const x = timeScale(view, width, left);
  const root = svg("svg", { width, height, id: "stages-svg" });
  rows.forEach((c, i) => root.appendChild(svg("text", { x: 4, y: top + i * rowH + rowH / 2 + 4 }, c)));
  for (const s of view.spans) {
    const i = rows.indexOf(s.component);
    const rect = svg("rect", { x: x(s.start), y: top + i * rowH + 3, width: Math.max(x(s.end) - x(s.start), 1),
      height: rowH - 6, fill: colour(s.component), class: "stage", "data-component": s.component,
      "data-start": s.start, "data-end": s.end });
    rect.appendChild(svg("title", {}, `${s.component} (${s.label}): ${fmt(s.start, 2)}-${fmt(s.end, 2)} s`));
    root.appendChild(rect);
  }
  timeAxis(root, x, view, top + rows.length * rowH);
  document.getElementById("stages").replaceChildren(root);
}

// --- migrations ---------------------------------------------------------------------

async function drawMigrations() {
  const data = await get("migrations");
  document.getElementById("no-migrations").hidden = data.steps.length > 0;
  for (const id of ["plans", "moves-per-step"]) document.getElementById(id).hidden = data.steps.length === 0;
  document.querySelector("#plans tbody").replaceChildren(...data.plans.map((p) => {
    const row = el("tr", { "data-step": p.step, "data-predicted-gain": p.predicted_gain_s ?? "",
      "data-measured-gain": p.measured_gain_s ?? "" });
    row.append(el("td", {}, `${p.step + 1}`), el("td", { class: "num" }, fmt(p.at_vs_rollout_end_s, 2)),
      el("td", {}, p.moves), el("td", { class: "num" }, fmt(p.current_s)), el("td", { class: "num" }, fmt(p.predicted_s)),
      el("td", { class: "num" }, fmt(p.measured_s)), el("td", { class: "num" }, fmt(p.predicted_gain_s)),
      el("td", { class: "num" }, fmt(p.measured_gain_s)));
    return row;
  }));
  document.querySelector("#moves-per-step tbody").replaceChildren(...data.steps.map((s) => {
    const moved = Object.entries(s.moves).map(([pair, n]) => `${pair} ${n}`).join(", ") || "none";
    const kinds = Object.entries(s.counts).map(([k, n]) => `${k} ${n}`).join(", ");
    const seconds = Object.entries(s.seconds).map(([k, v]) => `${k} ${fmt(v, 2)}`).join(", ");
    const row = el("tr", { "data-step": s.step });
    row.append(el("td", {}, `${s.step + 1}`), el("td", {}, moved), el("td", {}, kinds), el("td", {}, seconds),
      el("td", { class: "num" }, `${s.in_tail}`), el("td", { class: "num" }, `${s.decisions}`));
    return row;
  }));
}

// --- samples ------------------------------------------------------------------------

function sampleFilters() {
  return {
    step: document.getElementById("sample-step").value,
    min_reward: document.getElementById("min-reward").value,
    max_reward: document.getElementById("max-reward").value,
  };
}

async function drawSamples(onlyIfChanged = false) {
  const filters = sampleFilters();
  const asked = ++state.samplesAsked;
  const data = await get("samples", filters);
  if (asked !== state.samplesAsked) return; // a later filter's answer is the one to show
  const key = JSON.stringify([filters, data.total, data.steps]);
  if (onlyIfChanged && key === state.samplesKey) return;
  state.samplesKey = key;
  const select = document.getElementById("sample-step");
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "" }, "all"), ...data.steps.map((n) => el("option", { value: n }, `${n + 1}`)));
  select.value = chosen;
  document.getElementById("no-samples").hidden = data.steps.length > 0;
  document.getElementById("sample-count").textContent =
    `${data.total} sample${data.total === 1 ? "" : "s"}${data.total > data.samples.length ? `, the first ${data.samples.length} shown` : ""}`;
  const tbody = document.querySelector("#samples tbody");
  tbody.replaceChildren(...data.samples.map((s) => {
    const row = el("tr", { "data-step": s.step, "data-reward": s.reward ?? "", "data-id": s.id });
    row.append(el("td", {}, `${s.step + 1}`), el("td", { class: "num" }, fmt(s.reward, 2)), el("td", {}, s.finish),
      el("td", { class: "text", title: s.prompt }, s.prompt), el("td", { class: "text", title: s.response }, s.response),
      el("td", { class: "num" }, `${s.turns}`));
    row.addEventListener("click", () => showSample(row, s.step, s.id));
    return row;
  }));
  document.body.dataset.samplesShown = String(data.samples.length);
}

async function showSample(row, step, id) {
  document.querySelectorAll("#samples tr.selected").forEach((r) => r.classList.remove("selected"));
  row.classList.add("selected");
  const s = await get("sample", { step, id });
  const box = document.getElementById("sample-detail");
  if (!s) {
    box.hidden = true;
    return;
  }
  const parts = [el("h3", {}, `step ${step + 1}, sample ${s.id}: reward ${fmt(s.reward, 3)}, advantage ${fmt(s.advantage, 3)}, ` +
    `finish ${s.finish}, weights v${s.version}`)];
  parts.push(el("div", { class: "muted" }, "prompt"), el("pre", {}, s.prompt));
  if (s.turns) {
    parts.push(el("div", { class: "muted" }, "turns"));
    for (const t of s.turns) {
      const turn = el("div", { class: `turn ${t.role}` });
      turn.append(el("span", { class: "role" }, t.role), el("pre", {}, t.text));
      parts.push(turn);
    }
  }
  parts.push(el("div", { class: "muted" }, "response, each token shaded by its sampling probability (hover: log-prob)"));
  const tokens = el("div", { class: "tokens", id: "sample-tokens" });
  (s.tokens || []).forEach((text, i) => {
    const lp = s.logprobs ? s.logprobs[i] : null;
    const token = el("span", { "data-logprob": lp ?? "", title: lp === null ? "" : `log-prob ${lp.toFixed(4)}` +
      (s.old_logprobs ? `, trained policy ${s.old_logprobs[i].toFixed(4)}` : "") }, text);
    if (lp !== null) token.style.background = `rgba(196, 78, 82, ${Math.min(1, 1 - Math.exp(lp)).toFixed(3)})`;
    tokens.appendChild(token);
  });
  parts.push(tokens);
  parts.push(el("div", { class: "muted" }, `answer: ${s.answer}`));
  box.replaceChildren(...parts);
  box.hidden = false;
}

// --- wiring -------------------------------------------------------------------------

function debounce(fn, ms) {
  let timer = null;
  return () => {
    clearTimeout(timer);
    timer = setTimeout(fn, ms);
  };
}

document.getElementById("step-select").addEventListener("change", (e) => {
  state.follow = false;
  document.getElementById("follow").checked = false;
  state.step = Number(e.target.value);
  drawStep();
});
document.getElementById("follow").addEventListener("change", (e) => {
  state.follow = e.target.checked;
  drawStep();
});
const refilter = debounce(() => drawSamples(), 250);
for (const id of ["sample-step", "min-reward", "max-reward"]) {
  document.getElementById(id).addEventListener("input", refilter);
  document.getElementById(id).addEventListener("change", refilter);
}
poll();

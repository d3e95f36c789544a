// The planner's web page: jobs, frontier, measured iterations, the running plan's timeline and
// the ranks, polled every 2 s (the timeline fetched again only when the plan version moves).
// Plain DOM and SVG, no library: every value from the server is set as text (textContent,
// createTextNode, SVG <title>), never parsed as markup. The token lives in sessionStorage
// and travels only in the Authorization header, never in a URL.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
// The API beside the page: /ui -> /v1/ (behind a proxy's prefix too).
const API = location.pathname.replace(/ui\/?$/, "") + "v1/";
const $ = (id) => document.getElementById(id);
let selected = null;
let timer = null;
// The jobs table shows one page of the overview: PAGE jobs from `offset`, newest first
// unless the order is switched (the server holds any number of jobs; the page asks for its
// slice and says how many there are in all).
const PAGE = 50;
let offset = 0;
let order = "newest";
let timelineKey = null;  // "job:version" of the timeline drawn: a version's plan never changes
let timelineData = null;  // that timeline (the iteration chart's prediction), null if none

function credentials() {
  return { token: sessionStorage.getItem("perseus.token"), job: sessionStorage.getItem("perseus.job") };
}

async function get(path) {
  const { token } = credentials();
  const response = await fetch(API + path, { headers: { Authorization: `Bearer ${token}` }, cache: "no-store" });
  if (!response.ok) {
    let detail = `HTTP ${response.status}`;
    try { detail = (await response.json()).detail || detail; } catch (e) { /* not JSON */ }
    const err = new Error(typeof detail === "string" ? detail : JSON.stringify(detail));
    err.status = response.status;
    throw err;
  }
  return response.json();
}

// ----------------------------------------------------------------------------- formatting

const pct = (x) => (x === null || x === undefined ? "-" : `${(100 * x).toFixed(1)} %`);
const joules = (j) => (j === null || j === undefined ? "-" : `${Math.round(j).toLocaleString("en-US")} J`);
const secs = (s) => (s === null || s === undefined ? "-" : `${s.toFixed(4)} s`);

function policyText(p) {
  if (!p) return "-";
  const value = p.factor ?? p.seconds ?? p.eta;
  return value === undefined ? p.kind : `${p.kind}:${value}`;
}

function scheduleText(spec) {
  const chunks = spec.virtual_stages > 1 ? ` x ${spec.virtual_stages} chunks` : "";
  return `${spec.schedule}: ${spec.stages} stages x ${spec.microbatches} microbatches${chunks}`;
}

function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

// ----------------------------------------------------------------------------- the job table

function jobRow(view) {
  const s = view.savings;
  const row = el("tr", undefined, { "data-job": view.job_id });
  const name = el("td");
  name.append(el("span", view.name ?? "", { class: "name", "data-field": "name" }));
  name.append(el("div", view.job_id, { class: "id" }));
  row.append(name);
  row.append(el("td", view.state, { class: `state-${view.state}`, "data-field": "state" }));
  row.append(el("td", scheduleText(view.spec), { "data-field": "schedule" }));
  row.append(el("td", `${view.counts.ranks_registered} / ${view.counts.ranks_expected}`, { class: "num", "data-field": "ranks" }));
  row.append(el("td", policyText(view.policy), { "data-field": "policy" }));
  row.append(el("td", pct(s?.predicted_saving), { class: "num", "data-field": "predicted_saving" }));
  row.append(el("td", pct(s?.realized_saving), { class: "num", "data-field": "realized_saving" }));
  row.append(el("td", joules(s?.energy_saved_j), { class: "num", "data-field": "energy_saved_j" }));
  const chosen = view.chosen ? `v${view.version}, point ${view.chosen.index}` : "-";
  row.append(el("td", chosen, { "data-field": "chosen" }));
  row.addEventListener("click", () => { selected = view.job_id; refresh(); });
  if (view.job_id === selected) row.classList.add("selected");
  return row;
}

// ----------------------------------------------------------------------------- chart helpers
// Pure (no DOM): the browser test calls them through window.perseusCharts.

// The q-quantile of ascending numbers, linear between neighbours.
function quantile(sorted, q) {
  const at = (sorted.length - 1) * q, i = Math.floor(at), f = at - i;
  return i + 1 < sorted.length ? sorted[i] + f * (sorted[i + 1] - sorted[i]) : sorted[i];
}

// The span of `values` without their outliers: values more than three interquartile ranges
// (at least 2 % of the median) beyond the quartiles are left out, so that one stalled
// iteration cannot squash the others into a strip. [lo, hi], or null for no values.
function robustRange(values) {
  const sorted = values.filter(Number.isFinite).sort((a, b) => a - b);
  if (!sorted.length) return null;
  const q1 = quantile(sorted, 0.25), q3 = quantile(sorted, 0.75);
  const spread = Math.max(q3 - q1, 0.02 * Math.abs(quantile(sorted, 0.5)), 1e-12);
  const kept = sorted.filter((v) => v >= q1 - 3 * spread && v <= q3 + 3 * spread);
  return [kept[0], kept[kept.length - 1]];
}

// Ticks at round values (1, 2 or 5 times a power of ten; whole numbers when `integer`) over
// [lo, hi] in about `count` steps: {lo, hi, step, ticks, digits}, lo and hi widened to ticks.
function niceTicks(lo, hi, count = 5, integer = false) {
  if (!(hi > lo)) {
    const pad = integer ? 1 : Math.abs(lo) * 0.05 || 1;
    lo -= pad; hi += pad;
  }
  const raw = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  // The round step nearest the raw one (by ratio).
  let step = [1, 2, 5, 10].map((m) => m * power).reduce((a, b) => (Math.abs(Math.log(b / raw)) < Math.abs(Math.log(a / raw)) ? b : a));
  if (integer) step = Math.max(1, Math.round(step));
  const digits = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const round = (v) => +v.toFixed(digits);
  const first = round(Math.floor(lo / step + 1e-9) * step), last = round(Math.ceil(hi / step - 1e-9) * step);
  const ticks = [];
  for (let k = 0; first + k * step <= last + step * 1e-6; k++) ticks.push(round(first + k * step));
  return { lo: first, hi: last, step, ticks, digits };
}

const tickText = (v, digits) => v.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });

const overlap = (a, b) => a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;

// Places labels beside their markers so that no label overlaps another label, a marker
// (`obstacles`) or the edge of `bounds`: for each, in order, the first free spot of right,
// left, above, below, then further up and down; where none is free, the one overlapping
// least. labels: [{x, y, r, w, h}] (marker centre and radius, text box size);
// boxes are {x, y, w, h}. Returns each label's box.
function placeLabels(labels, obstacles, bounds) {
  const taken = [...obstacles];
  return labels.map(({ x, y, r, w, h }) => {
    const gap = r + 3;
    const spots = [[gap, -h / 2], [-gap - w, -h / 2], [-w / 2, -gap - h], [-w / 2, gap]];
    for (let k = 1; k <= 8; k++) {
      for (const dy of [-k * (h + 2), k * (h + 2)]) spots.push([gap, dy - h / 2], [-gap - w, dy - h / 2]);
    }
    let best = null, bestCost = Infinity;
    for (const [dx, dy] of spots) {
      const box = { x: x + dx, y: y + dy, w, h };
      const inside = box.x >= bounds.x && box.y >= bounds.y && box.x + w <= bounds.x + bounds.w && box.y + h <= bounds.y + bounds.h;
      const cost = (inside ? 0 : 1000) + taken.filter((t) => overlap(box, t)).length;
      if (cost < bestCost) { best = box; bestCost = cost; }
      if (cost === 0) break;
    }
    taken.push(best);
    return best;
  });
}

window.perseusCharts = { robustRange, niceTicks, placeLabels };

// ----------------------------------------------------------------------------- charts

// A text's width as drawn (the chart must be in the page), else an estimate.
function textWidth(chart, text) {
  const probe = svg("text", { x: -1000, y: -1000 }, text);
  chart.append(probe);
  const width = probe.getComputedTextLength() || 6.2 * text.length;
  probe.remove();
  return width;
}

// Axes of one plot: `area` {x, y, w, h} in pixels, `xt`/`yt` from niceTicks. Returns the
// value -> pixel mappers (a few pixels inside the frame, so edge points stay clear of it).
function axes(chart, area, xt, yt, { xLabel, yLabel, xTicks = true }) {
  const inset = 6;
  const sx = (v) => area.x + inset + ((v - xt.lo) / (xt.hi - xt.lo)) * (area.w - 2 * inset);
  const sy = (v) => area.y + area.h - inset - ((v - yt.lo) / (yt.hi - yt.lo)) * (area.h - 2 * inset);
  const bottom = area.y + area.h;
  chart.append(svg("line", { x1: area.x, y1: bottom, x2: area.x + area.w, y2: bottom, stroke: "#889" }));
  chart.append(svg("line", { x1: area.x, y1: area.y, x2: area.x, y2: bottom, stroke: "#889" }));
  for (const v of yt.ticks) {
    chart.append(svg("line", { x1: area.x, x2: area.x + area.w, y1: sy(v), y2: sy(v), stroke: "#e6eaee" }));
    chart.append(svg("text", { x: area.x - 5, y: sy(v) + 4, "text-anchor": "end", class: "tick y" }, tickText(v, yt.digits)));
  }
  for (const v of xt.ticks) {
    chart.append(svg("line", { x1: sx(v), x2: sx(v), y1: bottom, y2: bottom + 4, stroke: "#889" }));
    if (xTicks) chart.append(svg("text", { x: sx(v), y: bottom + 16, "text-anchor": "middle", class: "tick x" }, tickText(v, xt.digits)));
  }
  if (xLabel) chart.append(svg("text", { x: area.x + area.w / 2, y: bottom + 32, "text-anchor": "middle" }, xLabel));
  const mid = area.y + area.h / 2;
  chart.append(svg("text", { x: 14, y: mid, transform: `rotate(-90 14 ${mid})`, "text-anchor": "middle" }, yLabel));
  return { sx, sy };
}

const DIAMOND = 9, CHOSEN_R = 7;

function drawFrontier(view, frontier) {
  const points = frontier.points;
  const ref = frontier.baselines.default ?? frontier.baselines.all_fastest ?? points[0];
  const baselines = Object.entries(frontier.baselines).map(([key, b]) => ({ key, label: b.label ?? key.replaceAll("_", " "), ...b }));
  const all = [...points, ...baselines];
  const width = 560, height = 360;
  const area = { x: 72, y: 12, w: width - 72 - 16, h: height - 12 - 48 };
  const chart = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}` });
  $("frontier").replaceChildren(chart);
  const xt = niceTicks(Math.min(...all.map((p) => p.time_s)), Math.max(...all.map((p) => p.time_s)), 5);
  const yt = niceTicks(Math.min(...all.map((p) => p.energy_j)), Math.max(...all.map((p) => p.energy_j)), 5);
  const { sx, sy } = axes(chart, area, xt, yt, { xLabel: "iteration time (s)", yLabel: "energy per iteration, one pipeline (J)" });
  const hover = $("hover");
  const describe = (label, p) =>
    `${label}: ${p.time_s.toFixed(4)} s, ${p.energy_j.toFixed(1)} J, saving ${(100 * (1 - p.energy_j / ref.energy_j)).toFixed(1)} %`;
  const mark = (node, text) => {
    node.append(svg("title", {}, text));
    node.addEventListener("mouseenter", () => { hover.textContent = text; });
    chart.append(node);
  };
  chart.append(svg("polyline", {
    points: points.map((p) => `${sx(p.time_s)},${sy(p.energy_j)}`).join(" "), fill: "none", stroke: "#5b8fd1",
  }));
  const obstacles = [];
  points.forEach((p, i) => {
    const x = sx(p.time_s), y = sy(p.energy_j);
    mark(svg("circle", { cx: x, cy: y, r: 3, fill: "#5b8fd1", "data-point": i }), describe(`point ${i}`, p));
    obstacles.push({ x: x - 3, y: y - 3, w: 6, h: 6 });
  });
  // Baselines that land on the same spot (often: the default is also the per-stage clock)
  // share one marker and one label, so none hides under another.
  const groups = [];
  for (const b of baselines) {
    const x = sx(b.time_s), y = sy(b.energy_j);
    const group = groups.find((g) => Math.abs(g.x - x) < 4 && Math.abs(g.y - y) < 4);
    if (group) group.members.push(b); else groups.push({ x, y, members: [b] });
  }
  for (const g of groups) {
    const node = svg("g", { class: "baseline", "data-baseline": g.members.map((b) => b.key).join(" ") });
    node.append(svg("rect", { x: g.x - DIAMOND / 2, y: g.y - DIAMOND / 2, width: DIAMOND, height: DIAMOND, fill: "#e08a2e",
      stroke: "#fff", transform: `rotate(45 ${g.x} ${g.y})` }));
    mark(node, g.members.map((b) => describe(`baseline ${b.label}`, b)).join("; "));
    obstacles.push({ x: g.x - DIAMOND, y: g.y - DIAMOND, w: 2 * DIAMOND, h: 2 * DIAMOND });
  }
  const chosen = points[frontier.chosen_index];
  const cx = sx(chosen.time_s), cy = sy(chosen.energy_j);
  mark(svg("circle", { cx, cy, r: CHOSEN_R, fill: "#c0392b", "fill-opacity": 0.2, stroke: "#c0392b", "stroke-width": 2.5, id: "chosen-point" }),
    describe(`chosen point ${frontier.chosen_index} (${policyText(frontier.policy)})`, chosen));
  obstacles.push({ x: cx - CHOSEN_R - 1, y: cy - CHOSEN_R - 1, w: 2 * CHOSEN_R + 2, h: 2 * CHOSEN_R + 2 });
  const labels = [
    { x: cx, y: cy, r: CHOSEN_R, text: `chosen: ${policyText(frontier.policy)} (point ${frontier.chosen_index})`, cls: "chosen" },
    ...groups.map((g) => ({ x: g.x, y: g.y, r: DIAMOND, text: g.members.map((b) => b.label).join(" = "), cls: "baseline" })),
  ];
  for (const l of labels) { l.w = textWidth(chart, l.text); l.h = 12; }
  placeLabels(labels, obstacles, area).forEach((box, i) => {
    chart.append(svg("text", { x: box.x, y: box.y + 10, class: `label ${labels[i].cls}` }, labels[i].text));
  });
}

const PHASES = [["profiling", "#a05eb5"], ["baseline", "#8a8f96"], ["plan", "#1b7d3a"], ["default", "#e08a2e"]];
const PHASE_COLOUR = Object.fromEntries(PHASES);

// What the plan predicts for the reports' measure: a rank's span (its first instruction to its
// last: the median over GPUs) and the energy of every GPU over its span (the point's energy
// less the blocking outside the spans), for every replica.
function predictedSpans(view, timeline) {
  if (!timeline || !view.chosen || timeline.version !== view.version) return null;
  const spans = timeline.gpus.filter((row) => row.length).map((row) => row[row.length - 1].finish_s - row[0].start_s);
  if (!spans.length) return null;
  const sorted = [...spans].sort((a, b) => a - b);
  const power = timeline.p_block_w ?? view.p_block_w;
  const outside = spans.reduce((sum, s) => sum + (timeline.time_s - s), 0);
  return {
    version: timeline.version,
    time_s: quantile(sorted, 0.5),
    energy_j: power === null || power === undefined ? null : (timeline.energy_j - power * outside) * view.spec.data_parallel,
    pipeline_s: timeline.time_s,
  };
}

function drawIterations(view, activity, timeline) {
  const its = activity.iterations;
  const root = $("iterations");
  if (!its.length) { root.replaceChildren(el("p", "no iterations reported to this server process yet")); return; }
  const predicted = predictedSpans(view, timeline);
  const width = 560, left = 72, right = 16, panelH = 140, height = 30 + 2 * panelH + 24 + 44;
  const chart = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "iterations-svg" });
  root.replaceChildren(chart);
  const first = its[0].iteration, last = its[its.length - 1].iteration;
  const xt = niceTicks(first, last, 6, true);
  // The legend: the phases reported, then the prediction.
  let lx = left;
  const legend = svg("g", { class: "legend" });
  for (const [phase, colour] of PHASES.filter(([p]) => its.some((i) => i.phase === p))) {
    legend.append(svg("circle", { cx: lx + 4, cy: 12, r: 4, fill: colour }));
    legend.append(svg("text", { x: lx + 12, y: 16 }, phase));
    lx += 20 + textWidth(chart, phase);
  }
  if (predicted) {
    legend.append(svg("line", { x1: lx, x2: lx + 22, y1: 12, y2: 12, stroke: "#c0392b", "stroke-dasharray": "6 3", "stroke-width": 1.5 }));
    legend.append(svg("text", { x: lx + 28, y: 16 }, `predicted, plan v${predicted.version}`));
  }
  chart.append(legend);
  const panels = [
    { key: "time_s", label: "time (s): rank span", top: 30, unit: "s", digits: 4, predicted: predicted?.time_s },
    { key: "energy_j", label: "energy (J): every rank", top: 30 + panelH + 24, unit: "J", digits: 1, predicted: predicted?.energy_j },
  ];
  const planStart = predicted ? its.find((i) => i.phase === "plan" && i.plan_version === predicted.version)?.iteration : undefined;
  for (const panel of panels) {
    const area = { x: left, y: panel.top, w: width - left - right, h: panelH };
    const values = its.map((i) => i[panel.key]);
    const range = robustRange(values);
    const withPredicted = panel.predicted === null || panel.predicted === undefined ? range : [Math.min(range[0], panel.predicted), Math.max(range[1], panel.predicted)];
    const pad = (withPredicted[1] - withPredicted[0]) * 0.05;
    const yt = niceTicks(withPredicted[0] - pad, withPredicted[1] + pad, 4);
    const last = panel === panels[panels.length - 1];
    const { sx, sy } = axes(chart, area, xt, yt, { xLabel: last ? "iteration" : "", yLabel: panel.label, xTicks: last });
    let version = null;
    for (const it of its) {
      if (it.phase === "plan" && it.plan_version !== version) {
        version = it.plan_version;
        chart.append(svg("line", { x1: sx(it.iteration), x2: sx(it.iteration), y1: area.y, y2: area.y + area.h, stroke: "#bcc", "stroke-dasharray": "3 3" }));
        if (panel === panels[0]) chart.append(svg("text", { x: sx(it.iteration) + 3, y: area.y + 11, class: "version" }, `plan v${version}`));
      }
    }
    const off = { above: [], below: [] };
    for (const it of its) {
      const v = it[panel.key], colour = PHASE_COLOUR[it.phase] ?? "#5b8fd1";
      const title = `iteration ${it.iteration} (${it.phase ?? "?"}): ${it.time_s.toFixed(4)} s, ${it.energy_j.toFixed(1)} J over ${it.ranks} ranks`;
      let dot;
      if (v > yt.hi || v < yt.lo) {
        // Off the chart: a small arrowhead on the edge it lies beyond.
        const up = v > yt.hi, x = sx(it.iteration), y = up ? area.y + 1 : area.y + area.h - 1;
        off[up ? "above" : "below"].push(v);
        dot = svg("path", { d: up ? `M${x - 4},${y + 7}L${x},${y}L${x + 4},${y + 7}Z` : `M${x - 4},${y - 7}L${x},${y}L${x + 4},${y - 7}Z`, fill: colour, class: "off-chart" });
      } else {
        dot = svg("circle", { cx: sx(it.iteration), cy: sy(v), r: 2.5, fill: colour, "data-phase": it.phase ?? "" });
      }
      dot.append(svg("title", {}, title));
      chart.append(dot);
    }
    if (panel.predicted !== null && panel.predicted !== undefined) {
      const x0 = planStart === undefined ? area.x : sx(planStart);
      chart.append(svg("line", { x1: x0, x2: area.x + area.w, y1: sy(panel.predicted), y2: sy(panel.predicted),
        stroke: "#c0392b", "stroke-dasharray": "6 3", "stroke-width": 1.5, class: "predicted", "data-value": panel.predicted }));
    }
    const notes = [];
    const fmt = (v) => `${v.toFixed(panel.digits)} ${panel.unit}`;
    const count = (n) => `${n} iteration${n === 1 ? "" : "s"}`;
    if (off.above.length === 1) notes.push(`1 iteration above the chart (${fmt(off.above[0])})`);
    if (off.above.length > 1) notes.push(`${count(off.above.length)} above the chart (up to ${fmt(Math.max(...off.above))})`);
    if (off.below.length === 1) notes.push(`1 iteration below the chart (${fmt(off.below[0])})`);
    if (off.below.length > 1) notes.push(`${count(off.below.length)} below the chart (down to ${fmt(Math.min(...off.below))})`);
    if (notes.length) {
      chart.append(svg("text", { x: area.x + area.w - 4, y: area.y + 11, "text-anchor": "end", class: "off-note", "data-panel": panel.key }, notes.join("; ")));
    }
  }
  const lastIt = its[its.length - 1];
  let text = `last iteration ${lastIt.iteration}: ${lastIt.time_s.toFixed(4)} s, ${lastIt.energy_j.toFixed(1)} J. `;
  if (predicted) {
    text += `Predicted for plan v${predicted.version}: ${secs(predicted.time_s)}` +
      (predicted.energy_j === null ? "" : `, ${predicted.energy_j.toFixed(1)} J`) + ". ";
  }
  text += "Times are rank spans (a rank's first instruction to its last; the median over ranks), energies every rank's over its span";
  if (predicted) text += `: the whole pipeline's ${secs(predicted.pipeline_s)} also counts the fill before a rank starts`;
  root.append(el("p", text + ".", { id: "iterations-caption", class: "note" }));
}

// ----------------------------------------------------------------------------- the timeline

// matplotlib's viridis at five stops, as the PNG timelines colour clocks.
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const KIND_LETTER = { forward: "F", backward: "B", backward_input: "I", backward_weight: "W" };

function viridis(t) {
  const x = Math.min(Math.max(t, 0), 1) * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(x), VIRIDIS.length - 2), f = x - i;
  return VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
}

const rgb = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;
const MAX_BOXES = 20000;  // beyond this an SVG box per instruction is no longer light

function drawTimeline(t) {
  const root = $("timeline");
  const boxes = t.gpus.reduce((n, row) => n + row.length, 0);
  $("timeline-caption").textContent = `plan v${t.version}, point ${t.point}: ${t.time_s.toFixed(4)} s and ` +
    `${t.energy_j.toFixed(1)} J per iteration (one pipeline); boxes coloured by SM clock, outlined on the critical path`;
  if (boxes > MAX_BOXES) {
    root.replaceChildren(el("p", `${boxes} instructions: too many to draw here; 'perseus job frontier --timeline FILE' draws them`));
    return;
  }
  const width = 1140, rowH = 26, gap = 6;
  const m = { left: 58, right: 16, top: 8, bottom: 58 };
  const height = m.top + t.gpus.length * (rowH + gap) + m.bottom;
  const sx = (s) => m.left + (s / t.time_s) * (width - m.left - m.right);
  const chart = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "timeline-svg" });
  const span = t.max_frequency_mhz - t.min_frequency_mhz || 1;
  const colour = (mhz) => viridis((mhz - t.min_frequency_mhz) / span);
  const hover = $("timeline-hover");
  hover.textContent = "";  // it described a box of the timeline drawn before
  t.gpus.forEach((row, gpu) => {
    const y = m.top + gpu * (rowH + gap);
    chart.append(svg("rect", { x: m.left, y, width: width - m.left - m.right, height: rowH, fill: "#eceff2" }));
    chart.append(svg("text", { x: m.left - 6, y: y + rowH / 2 + 4, "text-anchor": "end" }, `GPU ${gpu}`));
    for (const ins of row) {
      const letter = KIND_LETTER[ins.instruction] ?? "?";
      const label = `${letter}${ins.microbatch}${ins.chunk === undefined || ins.chunk === null ? "" : "." + ins.chunk}`;
      const x = sx(ins.start_s), w = Math.max(sx(ins.finish_s) - x - 0.6, 0.6);
      const c = colour(ins.frequency_mhz);
      const box = svg("g", { "data-gpu": gpu, "data-instruction": label, "data-clock": ins.frequency_mhz, class: "box" });
      box.append(svg("rect", { x, y, width: w, height: rowH, fill: rgb(c),
        stroke: ins.critical ? "#1d232a" : "none", "stroke-width": ins.critical ? 1.6 : 0 }));
      if (letter !== "F") box.append(svg("rect", { x, y: y + rowH - 5, width: w, height: 5, fill: "#000", "fill-opacity": 0.3 }));
      if (w >= 9 * label.length) {
        const light = 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] < 140;
        box.append(svg("text", { x: x + w / 2, y: y + rowH / 2 + 3, "text-anchor": "middle", class: light ? "on-dark" : "on-light" }, label));
      }
      const text = `GPU ${gpu}: ${label} (${ins.instruction}, microbatch ${ins.microbatch}) at ${ins.frequency_mhz} MHz, ` +
        `${ins.start_s.toFixed(4)} s to ${ins.finish_s.toFixed(4)} s${ins.critical ? ", critical" : ""}`;
      box.append(svg("title", {}, text));
      box.addEventListener("mouseenter", () => { hover.textContent = text; });
      chart.append(box);
    }
  });
  const axisY = m.top + t.gpus.length * (rowH + gap);
  chart.append(svg("line", { x1: m.left, y1: axisY, x2: width - m.right, y2: axisY, stroke: "#889" }));
  const ticks = niceTicks(0, t.time_s, 8);
  for (const s of ticks.ticks.filter((v) => v <= t.time_s * (1 + 1e-9))) {
    chart.append(svg("text", { x: sx(s), y: axisY + 14, "text-anchor": "middle" }, tickText(s, ticks.digits)));
  }
  chart.append(svg("text", { x: (width + m.left) / 2, y: axisY + 30, "text-anchor": "middle" }, "time in the iteration (s)"));
  // The clock scale: a gradient from the profile's lowest to its highest clock.
  const defs = svg("defs");
  const gradient = svg("linearGradient", { id: "clock-scale" });
  VIRIDIS.forEach((c, i) => gradient.append(svg("stop", { offset: `${(100 * i) / (VIRIDIS.length - 1)}%`, "stop-color": rgb(c) })));
  defs.append(gradient);
  chart.append(defs);
  const lx = width - m.right - 260, ly = axisY + 38;
  chart.append(svg("text", { x: lx - 6, y: ly + 9, "text-anchor": "end" }, `SM clock ${t.min_frequency_mhz} MHz`));
  chart.append(svg("rect", { x: lx, y: ly, width: 170, height: 12, fill: "url(#clock-scale)" }));
  chart.append(svg("text", { x: lx + 176, y: ly + 9 }, `${t.max_frequency_mhz} MHz`));
  chart.append(svg("rect", { x: m.left, y: ly, width: 24, height: 12, fill: "#8a8f96" }));
  chart.append(svg("rect", { x: m.left, y: ly + 8, width: 24, height: 4, fill: "#000", "fill-opacity": 0.3 }));
  chart.append(svg("text", { x: m.left + 30, y: ly + 10 }, "backward (dark strip)"));
  chart.append(svg("rect", { x: m.left + 170, y: ly, width: 24, height: 12, fill: "#eceff2" }));
  chart.append(svg("text", { x: m.left + 200, y: ly + 10 }, "blocked (draws P_block)"));
  root.replaceChildren(chart);
}

async function refreshTimeline(view) {
  if (!view.chosen) {
    timelineKey = null;
    timelineData = null;
    $("timeline-caption").textContent = "";
    $("timeline").replaceChildren(el("p", `no plan yet (${view.state})`));
    return;
  }
  const key = `${view.job_id}:${view.version}`;
  if (key === timelineKey) return;
  timelineData = null;
  try {
    timelineData = await get(`jobs/${view.job_id}/timeline`);
    drawTimeline(timelineData);
  } catch (err) {
    if (err.status === 401 || err.status === 403) throw err;
    // Say why here (an old frontier without its profile, say); the rest of the page goes on.
    $("timeline").replaceChildren(el("p", `no timeline: ${err.message}`, { class: "error" }));
  }
  timelineKey = key;
}

// ----------------------------------------------------------------------------- ranks

const clockTime = (unixS) => new Date(unixS * 1000).toLocaleTimeString();

// "5 min 40 s", as 'perseus job status' says a wait.
function durationText(seconds) {
  const whole = Math.round(seconds);
  if (whole < 60) return `${whole} s`;
  if (whole < 600) return `${Math.floor(whole / 60)} min ${whole % 60} s`;
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, "0")} min`;
}

function profilingText(p) {
  const head = `profiling: ${p.clocks_done} of ${p.clocks_planned} clocks`;
  if (p.time_left_s === null || p.time_left_s === undefined) return `${head} (the time left is known once the first clock is measured)`;
  return `${head}, about ${durationText(p.time_left_s)} left`;
}

function rankState(r, version, gaveUp) {
  if (r && r.following) return ["following plan v" + version, "following"];
  const g = gaveUp.get(r ? r.rank : null);
  if (g) return [`gave up at ${clockTime(g.at_s)}: ${g.reason}`, "gave-up"];
  if (!r) return ["no report yet", ""];
  if (r.phase === "default") return ["at default clocks", "gave-up"];
  if (r.phase === "plan") return [`on plan v${r.plan_version} (not the current v${version})`, ""];
  if (r.phase === "profiling" && r.profiling) return [profilingText(r.profiling), "profiling"];
  return [r.phase ?? "no report yet", ""];
}

function drawRanks(view, activity) {
  const body = $("ranks").tBodies[0];
  const gaveUp = new Map(view.gave_up.map((g) => [g.rank, g]));
  const rows = activity.ranks.map((r) => {
    const row = el("tr", undefined, { "data-rank": r.rank });
    const [text, cls] = rankState(r, activity.version, gaveUp);
    const age = r.last_report_age_s;
    row.append(el("td", r.rank, { class: "num" }), el("td", r.stage, { class: "num" }),
      el("td", r.data_parallel_rank, { class: "num" }), el("td", r.host ?? "-"),
      el("td", text, { class: cls, "data-field": "rank-state" }), el("td", r.iterations, { class: "num" }),
      el("td", age === null ? "-" : `${clockTime(Date.now() / 1000 - age)} (${age.toFixed(1)} s ago)`));
    return row;
  });
  // A rank may give up before it registers (it rejected the job): shown all the same.
  const seen = new Set(activity.ranks.map((r) => r.rank));
  for (const g of view.gave_up.filter((g) => !seen.has(g.rank))) {
    const row = el("tr", undefined, { "data-rank": g.rank });
    row.append(el("td", g.rank, { class: "num" }), el("td", "-"), el("td", "-"), el("td", "-"),
      el("td", `gave up at ${clockTime(g.at_s)}: ${g.reason}`, { class: "gave-up", "data-field": "rank-state" }),
      el("td", "-"), el("td", "-"));
    rows.push(row);
  }
  body.replaceChildren(...rows);
}

// ----------------------------------------------------------------------------- cluster power

// Watts as 'perseus cluster status' says them: 3 significant digits, W, kW or MW.
function watts(w) {
  if (w === null || w === undefined) return "-";
  for (const [scale, unit] of [[1e6, "MW"], [1e3, "kW"]]) {
    if (Math.abs(w) >= scale) return `${+(w / scale).toPrecision(3)} ${unit}`;  // as Python's .3g
  }
  return `${Math.round(w)} W`;
}

function windowText(w) {
  const from = w.from_s === null || w.from_s === undefined ? "now" : new Date(w.from_s * 1000).toLocaleString();
  const to = w.to_s === null || w.to_s === undefined ? "until lifted" : `to ${new Date(w.to_s * 1000).toLocaleString()}`;
  const when = w.active ? "in force" : w.ended ? "ended" : "scheduled";
  return `window: ${watts(w.power_w)} from ${from} ${to} (${when})`;
}

// The cluster's budget, window and power (GET /v1/cluster/budget, the admin token's): hidden
// for a job's token, or where the planner answers 401/403 to it; never stops the job table.
async function drawCluster() {
  const { job } = credentials();
  if (job) { $("cluster").hidden = true; return; }
  let c;
  try {
    c = await get("cluster/budget");
  } catch (err) {
    $("cluster").hidden = true;
    if (err.status !== 401 && err.status !== 403) console.warn("cluster budget:", err.message);
    return;
  }
  $("cluster").hidden = false;
  $("cluster-budget").textContent = c.budget_w === null ? "no budget" : `budget: ${watts(c.budget_w)}` +
    (c.window?.active && c.standing_w !== null ? ` (the window's; standing ${watts(c.standing_w)})` : "");
  $("cluster-window").hidden = !c.window;
  $("cluster-window").textContent = c.window ? windowText(c.window) : "";
  const of = (w) => (c.budget_w && w !== null && w !== undefined ? ` (${(100 * w / c.budget_w).toFixed(1)} % of the budget)` : "");
  $("cluster-power").textContent = `predicted: ${watts(c.predicted_w)}${of(c.predicted_w)}; ` +
    `measured: ${watts(c.measured_w)}${of(c.measured_w)}; at the jobs' policies: ${watts(c.policy_w)}, least: ${watts(c.least_w)}`;
  const met = $("cluster-met");
  if (c.met === null || c.met === undefined) {
    met.textContent = "";
    met.className = "";
  } else {
    met.textContent = c.met ? `met: every job within the budget, weighted slowdown ${pct(c.weighted_slowdown)}` :
      `not met: ${c.message ?? `${watts(c.shortfall_w)} over the budget`}`;
    met.className = c.met ? "met" : "unmet";
  }
}

async function drawDetail(view) {
  $("detail").hidden = false;
  $("detail-title").textContent = view.name ? `${view.name} (${view.job_id})` : view.job_id;
  const s = view.savings;
  $("detail-summary").textContent = `${view.state}; ${scheduleText(view.spec)}; policy ${policyText(view.policy)}; ` +
    `plan version ${view.version}; energy saved so far ${joules(s?.energy_saved_j)} of ${joules(s?.energy_j)} reported`;
  if (view.gave_up.length) {
    $("detail-summary").textContent += `; ${view.gave_up.length} of ${view.counts.ranks_expected} ranks gave up (default clocks)`;
  }
  const left = (view.profiling ?? []).map((p) => p.time_left_s).filter((s) => s !== null && s !== undefined);
  if (view.profiling?.length) {
    $("detail-summary").textContent += `; ${view.profiling.length} ranks profiling` +
      (left.length ? `, about ${durationText(Math.max(...left))} left (the slowest)` : "");
  }
  // Absent fields are at their defaults: priority 1, no budget moving the job.
  $("detail-budget").textContent = `priority ${view.priority ?? 1}; ` +
    (view.budget ? view.budget.reason : "the cluster budget does not move this job");
  const activity = await get(`jobs/${view.job_id}/activity`);
  drawRanks(view, activity);
  await refreshTimeline(view);
  drawIterations(view, activity, timelineKey === `${view.job_id}:${view.version}` ? timelineData : null);
  if (view.chosen) {
    drawFrontier(view, await get(`jobs/${view.job_id}/frontier`));
  } else {
    $("frontier").replaceChildren(el("p", `no frontier yet (${view.state})`));
  }
}

// ----------------------------------------------------------------------------- the loop

// One page of the overview and the number of jobs in all; a page past the end (jobs were
// deleted) moves back to the last one.
async function jobPage() {
  const ask = () => get(`overview?limit=${PAGE}&offset=${offset}&order=${order}`);
  let page = await ask();
  const total = page.total ?? page.jobs.length;
  if (!page.jobs.length && offset > 0 && total > 0) {
    offset = Math.floor((total - 1) / PAGE) * PAGE;
    page = await ask();
  }
  return { views: page.jobs, total: page.total ?? page.jobs.length };
}

function drawPager(shown, total) {
  $("pager").hidden = total <= PAGE && offset === 0;
  $("page").textContent = shown
    ? `jobs ${(offset + 1).toLocaleString("en-US")}-${(offset + shown).toLocaleString("en-US")} of ${total.toLocaleString("en-US")}`
    : `no jobs of ${total.toLocaleString("en-US")}`;
  $("newer").disabled = order === "newest" ? offset === 0 : offset + shown >= total;
  $("older").disabled = order === "newest" ? offset + shown >= total : offset === 0;
}

// The selected job's view: from the page, else fetched (it was chosen on another page).
async function selectedView(views) {
  if (!selected && views.length) selected = views[0].job_id;
  const view = views.find((v) => v.job_id === selected);
  if (view || !selected) return view;
  try {
    return await get(`jobs/${selected}`);
  } catch (err) {
    if (err.status !== 404) throw err;
    selected = views.length ? views[0].job_id : null;  // deleted: show this page's first
    return views[0];
  }
}

async function refresh() {
  clearTimeout(timer);
  const { job } = credentials();
  try {
    const { views, total } = job ? { views: [await get(`jobs/${job}`)], total: 1 } : await jobPage();
    $("jobs").tBodies[0].replaceChildren(...views.map(jobRow));
    if (job) $("pager").hidden = true; else drawPager(views.length, total);
    await drawCluster();
    const view = await selectedView(views);
    if (view) await drawDetail(view); else $("detail").hidden = true;
    $("status").textContent = `${total.toLocaleString("en-US")} job${total === 1 ? "" : "s"}, updated ${new Date().toLocaleTimeString()}`;
    $("status").className = "";
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
  } catch (err) {
    $("status").textContent = err.message;
    $("status").className = "error";
    if (err.status === 401 || err.status === 403) { showLogin(); return; }
  }
  timer = setTimeout(refresh, POLL_MS);
}

function showLogin() {
  $("login").hidden = false;
  $("main").hidden = true;
  $("forget").hidden = true;
}

function start() {
  $("login").hidden = true;
  $("main").hidden = false;
  $("forget").hidden = false;
  refresh();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem("perseus.token", $("token").value.trim());
    const job = $("job").value.trim();
    if (job) sessionStorage.setItem("perseus.job", job); else sessionStorage.removeItem("perseus.job");
    selected = job || null;
    start();
  });
  // Newer and older: a page towards the newest or the oldest job, whichever the order.
  $("newer").addEventListener("click", () => {
    offset = Math.max(0, order === "newest" ? offset - PAGE : offset + PAGE);
    refresh();
  });
  $("older").addEventListener("click", () => {
    offset = Math.max(0, order === "newest" ? offset + PAGE : offset - PAGE);
    refresh();
  });
  $("order").addEventListener("change", () => {
    order = $("order").value;
    offset = 0;
    refresh();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem("perseus.token");
    sessionStorage.removeItem("perseus.job");
    clearTimeout(timer);
    showLogin();
  });
  if (credentials().token) start(); else showLogin();
});

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

// ----------------------------------------------------------------------------- charts

// A chart frame: axes from the data's range, returning (x, y) -> pixel mappers.
function frame(root, xs, ys, xLabel, yLabel, width = 560, height = 340) {
  const m = { left: 70, right: 20, top: 15, bottom: 40 };
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= 1; y1 += 1; }
  const padX = (x1 - x0) * 0.05, padY = (y1 - y0) * 0.08;
  x0 -= padX; x1 += padX; y0 -= padY; y1 += padY;
  const sx = (x) => m.left + ((x - x0) / (x1 - x0)) * (width - m.left - m.right);
  const sy = (y) => height - m.bottom - ((y - y0) / (y1 - y0)) * (height - m.top - m.bottom);
  const chart = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}` });
  chart.append(svg("line", { x1: m.left, y1: height - m.bottom, x2: width - m.right, y2: height - m.bottom, stroke: "#889" }));
  chart.append(svg("line", { x1: m.left, y1: m.top, x2: m.left, y2: height - m.bottom, stroke: "#889" }));
  for (let i = 0; i <= 4; i++) {
    const xv = x0 + ((x1 - x0) * i) / 4, yv = y0 + ((y1 - y0) * i) / 4;
    chart.append(svg("text", { x: sx(xv), y: height - m.bottom + 15, "text-anchor": "middle" }, +xv.toPrecision(4)));
    chart.append(svg("text", { x: m.left - 5, y: sy(yv) + 4, "text-anchor": "end" }, +yv.toPrecision(4)));
  }
  chart.append(svg("text", { x: (width + m.left) / 2, y: height - 5, "text-anchor": "middle" }, xLabel));
  chart.append(svg("text", { x: 12, y: m.top + 5, transform: `rotate(-90 12 ${m.top + 5})`, "text-anchor": "end" }, yLabel));
  root.replaceChildren(chart);
  return { chart, sx, sy, x0, x1 };
}

function drawFrontier(view, frontier) {
  const points = frontier.points;
  const baselines = Object.entries(frontier.baselines);
  const ref = frontier.baselines.default ?? frontier.baselines.all_fastest ?? points[0];
  const all = [...points, ...baselines.map(([, b]) => b)];
  const { chart, sx, sy } = frame($("frontier"), all.map((p) => p.time_s), all.map((p) => p.energy_j),
    "iteration time (s)", "energy per iteration, one pipeline (J)");
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
  points.forEach((p, i) => mark(svg("circle", { cx: sx(p.time_s), cy: sy(p.energy_j), r: 3, fill: "#5b8fd1", "data-point": i }),
    describe(`point ${i}`, p)));
  const labelled = [];  // label positions so far: baselines often coincide
  for (const [name, b] of baselines) {
    const x = sx(b.time_s), y = sy(b.energy_j);
    mark(svg("rect", { x: x - 5, y: y - 5, width: 10, height: 10, fill: "#e08a2e", transform: `rotate(45 ${x} ${y})`, "data-baseline": name }),
      describe(`baseline ${name}`, b));
    let ly = y - 6;
    while (labelled.some(([px, py]) => Math.abs(px - x) < 80 && Math.abs(py - ly) < 12)) ly += 12;
    labelled.push([x, ly]);
    chart.append(svg("text", { x: x + 8, y: ly }, name));
  }
  const chosen = points[frontier.chosen_index];
  mark(svg("circle", { cx: sx(chosen.time_s), cy: sy(chosen.energy_j), r: 7, fill: "#c0392b", "fill-opacity": 0.2, stroke: "#c0392b", "stroke-width": 2.5, id: "chosen-point" }),
    describe(`chosen point ${frontier.chosen_index} (${policyText(frontier.policy)})`, chosen));
  chart.append(svg("text", { x: sx(chosen.time_s) + 10, y: sy(chosen.energy_j) + 16, fill: "#c0392b" },
    `chosen: ${policyText(frontier.policy)}`));
}

function drawIterations(view, activity) {
  const its = activity.iterations;
  const root = $("iterations");
  if (!its.length) { root.replaceChildren(el("p", "no iterations reported to this server process yet")); return; }
  const predicted = view.chosen?.expected_iteration_time_s;
  const ys = its.map((i) => i.time_s).concat(predicted ? [predicted] : []);
  const { chart, sx, sy } = frame(root, its.map((i) => i.iteration), ys, "iteration", "time (s): median over ranks");
  const colors = { baseline: "#888", profiling: "#b8a", default: "#e08a2e" };
  let version = null;
  for (const it of its) {
    if (it.phase === "plan" && it.plan_version !== version) {
      version = it.plan_version;
      chart.append(svg("line", { x1: sx(it.iteration), x2: sx(it.iteration), y1: 15, y2: 300, stroke: "#cdd", "stroke-dasharray": "3 3" }));
      chart.append(svg("text", { x: sx(it.iteration) + 3, y: 26 }, `plan v${version}`));
    }
    const dot = svg("circle", { cx: sx(it.iteration), cy: sy(it.time_s), r: 2.5, fill: colors[it.phase] ?? "#1b7d3a" });
    dot.append(svg("title", {}, `iteration ${it.iteration} (${it.phase ?? "?"}): ${it.time_s.toFixed(4)} s, ${it.energy_j.toFixed(1)} J over ${it.ranks} ranks`));
    chart.append(dot);
  }
  if (predicted) {
    chart.append(svg("line", { x1: 70, x2: 540, y1: sy(predicted), y2: sy(predicted), stroke: "#c0392b", "stroke-dasharray": "6 4" }));
    chart.append(svg("text", { x: 75, y: sy(predicted) - 4, fill: "#c0392b" }, `predicted ${predicted.toFixed(4)} s`));
  }
  const last = its[its.length - 1];
  root.append(el("p", `last iteration ${last.iteration}: ${last.time_s.toFixed(4)} s, ${last.energy_j.toFixed(1)} J (every rank); ` +
    `predicted ${secs(predicted)}, ${view.chosen ? (view.chosen.expected_energy_j * view.spec.data_parallel).toFixed(1) + " J" : "-"}`));
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
  for (let i = 0; i <= 8; i++) {
    const s = (t.time_s * i) / 8;
    chart.append(svg("text", { x: sx(s), y: axisY + 14, "text-anchor": "middle" }, +s.toPrecision(3)));
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
    $("timeline-caption").textContent = "";
    $("timeline").replaceChildren(el("p", `no plan yet (${view.state})`));
    return;
  }
  const key = `${view.job_id}:${view.version}`;
  if (key === timelineKey) return;
  try {
    drawTimeline(await get(`jobs/${view.job_id}/timeline`));
  } catch (err) {
    if (err.status === 401 || err.status === 403) throw err;
    // Say why here (an old frontier without its profile, say); the rest of the page goes on.
    $("timeline").replaceChildren(el("p", `no timeline: ${err.message}`, { class: "error" }));
  }
  timelineKey = key;
}

// ----------------------------------------------------------------------------- ranks

const clockTime = (unixS) => new Date(unixS * 1000).toLocaleTimeString();

function rankState(r, version, gaveUp) {
  if (r && r.following) return ["following plan v" + version, "following"];
  const g = gaveUp.get(r ? r.rank : null);
  if (g) return [`gave up at ${clockTime(g.at_s)}: ${g.reason}`, "gave-up"];
  if (!r) return ["no report yet", ""];
  if (r.phase === "default") return ["at default clocks", "gave-up"];
  if (r.phase === "plan") return [`on plan v${r.plan_version} (not the current v${version})`, ""];
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

async function drawDetail(view) {
  $("detail").hidden = false;
  $("detail-title").textContent = view.name ? `${view.name} (${view.job_id})` : view.job_id;
  const s = view.savings;
  $("detail-summary").textContent = `${view.state}; ${scheduleText(view.spec)}; policy ${policyText(view.policy)}; ` +
    `plan version ${view.version}; energy saved so far ${joules(s?.energy_saved_j)} of ${joules(s?.energy_j)} reported`;
  if (view.gave_up.length) {
    $("detail-summary").textContent += `; ${view.gave_up.length} of ${view.counts.ranks_expected} ranks gave up (default clocks)`;
  }
  const activity = await get(`jobs/${view.job_id}/activity`);
  drawRanks(view, activity);
  drawIterations(view, activity);
  await refreshTimeline(view);
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

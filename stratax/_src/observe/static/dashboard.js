// stratax dashboard: polls /api/data and draws with uPlot (vendored). No framework.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token");
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
  const series = {};   // task -> array of records, in arrival order
  const charts = {};   // element id -> {plot, key}
  let seq = 0;
  let t0 = null;
  let starts = [];        // wall times of the group's starts (restarts after the first)
  let endedAt = null;     // the run's end (s): the page stops polling and ages stop there
  let lastContact = null; // the last answer of the server (s)
  const PREEMPTED = 42;   // the exit code of a preempted worker (stratax launch restarts it)

  const fmt = (v, digits) => (v === null || v === undefined || Number.isNaN(v)) ? "–" : Number(v).toFixed(digits);
  const isWorker = (task) => !task.startsWith("ps_");
  const commSeconds = (r) => (r.collective_s != null) ? r.collective_s
    : ((r.pull_s != null || r.push_s != null) ? (r.pull_s || 0) + (r.push_s || 0) : null);
  const share = (part, whole) => (part != null && whole) ? 100 * part / whole : null;

  // One chart: x from xOf(record), y from yOf(record), one line per task that has values.
  const CHARTS = [
    {id: "chart-throughput", title: "Throughput per worker (samples/s) vs wall time (s)", tasks: isWorker,
     xLabel: "time (s)", x: (r) => r.t - t0, y: (r) => r.samples_per_s},
    {id: "chart-steptime", title: "Step time per worker (ms) vs wall time (s)", tasks: isWorker,
     xLabel: "time (s)", x: (r) => r.t - t0, y: (r) => r.step_s == null ? null : 1000 * r.step_s},
    {id: "chart-loss-step", title: "Loss vs step", tasks: isWorker,
     xLabel: "step", x: (r) => r.step, y: (r) => r.loss},
    {id: "chart-loss-time", title: "Loss vs wall time (s)", tasks: isWorker,
     xLabel: "time (s)", x: (r) => r.t - t0, y: (r) => r.loss},
    {id: "chart-comm", title: "Communication share of the step (%): all-reduce or pull + push", tasks: isWorker,
     xLabel: "time (s)", x: (r) => r.t - t0, y: (r) => share(commSeconds(r), r.step_s), skipAllZero: true},
    {id: "chart-ps", title: "Parameter-server load per shard (requests/s)", tasks: (t) => t.startsWith("ps_"),
     xLabel: "time (s)", x: (r) => r.t - t0, y: (r) => r.requests_per_s},
  ];

  // Which start of the group a record belongs to: 0, then 1 after the first restart, ...
  function attemptOf(t) {
    let k = 0;
    for (let i = 1; i < starts.length; i++) if (t >= starts[i]) k = i;
    return k;
  }

  // Each (task, start) is its own line: a restarted run's steps start again from its
  // checkpoint, and the gap between the starts is not bridged. A dashed red line marks each
  // restart (where its first record is on a step axis).
  function drawChart(spec) {
    const tasks = Object.keys(series).sort().filter(spec.tasks);
    const tables = [], names = [], styles = [], marks = new Set();
    tasks.forEach((task, colour) => {
      const attempts = new Map();
      for (const r of series[task]) {
        const k = attemptOf(r.t);
        if (!attempts.has(k)) attempts.set(k, {xs: [], ys: [], lastX: -Infinity});
        const line = attempts.get(k);
        const x = spec.x(r), y = spec.y(r);
        if (x == null || y == null || Number.isNaN(x) || x <= line.lastX) continue;
        line.xs.push(x); line.ys.push(y); line.lastX = x;
      }
      for (const [k, line] of [...attempts.entries()].sort((a, b) => a[0] - b[0])) {
        if (!line.xs.length) continue;
        tables.push([line.xs, line.ys]);
        names.push(k === 0 ? task : `${task} (start ${k})`);
        styles.push({colour: COLORS[colour % COLORS.length], dash: k === 0 ? undefined : [6, 3]});
        if (k > 0) marks.add(spec.xLabel === "step" ? line.xs[0] : starts[k] - t0);
      }
    });
    const el = document.getElementById(spec.id);
    // One replica has nothing to all-reduce: no chart of zeros.
    if (spec.skipAllZero && tables.every(([, ys]) => ys.every((y) => y === 0))) return;
    if (!tables.length) return;
    el.hidden = false;
    const data = uPlot.join(tables);
    const restarts = [...marks].sort((a, b) => a - b);
    const key = names.join(",") + "|" + restarts.join(",");
    const existing = charts[spec.id];
    if (existing && existing.key === key) { existing.plot.setData(data); return; }
    if (existing) existing.plot.destroy();
    const opts = {
      title: spec.title, width: Math.max(400, el.clientWidth - 16), height: 260,
      scales: {x: {time: false}},
      series: [{label: spec.xLabel}].concat(names.map((name, i) => ({
        label: name, stroke: styles[i].colour, dash: styles[i].dash, width: 2, spanGaps: true,
        points: {show: false}}))),
      axes: [{}, {size: 80, values: (u, values) => values.map(compact)}],
      legend: {live: false},  // names only: no "--" values until hovered
      hooks: {draw: [(u) => drawRestarts(u, restarts)]},
    };
    charts[spec.id] = {plot: new uPlot(opts, data, el), key: key};
  }

  function drawRestarts(u, xs) {
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = "#a40000"; ctx.lineWidth = 1; ctx.setLineDash([4, 4]);
    for (const x of xs) {
      const px = u.valToPos(x, "x", true);
      ctx.beginPath(); ctx.moveTo(px, u.bbox.top); ctx.lineTo(px, u.bbox.top + u.bbox.height);
      ctx.stroke();
    }
    ctx.restore();
  }

  // Axis labels short enough for the axis: 250000 -> "250k", 1200000 -> "1.2M".
  function compact(v) {
    if (v == null) return "";
    const a = Math.abs(v);
    if (a >= 1e6) return +(v / 1e6).toPrecision(3) + "M";
    if (a >= 1e4) return +(v / 1e3).toPrecision(3) + "k";
    return String(+v.toPrecision(4));
  }

  function row(cells, cls) {
    const tr = document.createElement("tr");
    if (cls) tr.className = cls;
    for (const c of cells) { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); }
    return tr;
  }

  function drawTables(tasks, now) {
    const body = document.querySelector("#workers tbody");
    const psBody = document.querySelector("#servers tbody");
    body.replaceChildren(); psBody.replaceChildren();
    for (const name of Object.keys(tasks).sort()) {
      const r = tasks[name];
      const age = fmt(now - r.t, 1) + " s ago";
      if (!isWorker(name)) {
        document.getElementById("ps-section").hidden = false;
        psBody.appendChild(row([name, fmt(r.requests_per_s, 1),
          r.bytes_per_s == null ? "–" : fmt(r.bytes_per_s / 1e6, 2), age]));
        continue;
      }
      const tr = row([name, r.step == null ? "–" : String(r.step), r.step_s == null ? "–" : fmt(1000 * r.step_s, 2),
        fmt(r.samples_per_s, 0), r.input_s == null ? "–" : fmt(share(r.input_s, r.step_s), 1) + " %",
        commSeconds(r) == null ? "–" : fmt(share(commSeconds(r), r.step_s), 1) + " %",
        fmt(r.loss, 4), age], r.straggler ? "straggler" : "");
      tr.dataset.task = name;
      body.appendChild(tr);
    }
  }

  function drawEvents(events) {
    starts = events.filter((e) => e.kind === "start").map((e) => e.t).sort((a, b) => a - b);
    const list = document.getElementById("events");
    list.replaceChildren();
    const status = document.getElementById("status");
    for (const e of events) {
      const li = document.createElement("li");
      li.className = e.kind;
      const when = new Date(e.t * 1000).toLocaleTimeString();
      let text = `${when} ${e.kind}`;
      if (e.kind === "start") text += ` (start ${e.restart}): ${(e.tasks || []).join(", ")}`;
      else if (e.message) text += `: ${e.message}`;
      li.textContent = text;
      if (e.tail && e.tail.length) {
        const pre = document.createElement("pre");
        pre.textContent = e.tail.join("\n");
        li.appendChild(pre);
      }
      list.appendChild(li);
    }
    const last = events[events.length - 1];
    if (last && last.kind === "end") {
      endedAt = last.t;
      // The failure that ended the run: the last one (earlier ones were restarted from).
      const failures = events.filter((e) => e.kind === "failure");
      const cause = failures.length ? failures[failures.length - 1] : null;
      let text, cls;
      if (last.exit_code === 0) { text = "ended"; cls = "ended"; }
      else if (last.exit_code === PREEMPTED) { text = `preempted (exit ${PREEMPTED})`; cls = "failed"; }
      else { text = `failed (exit ${last.exit_code})`; cls = "failed"; }
      const why = cause ? cause.message : (last.exit_code !== 0 ? last.message : null);
      status.textContent = why ? `${text}: ${why}` : text;
      status.className = "status " + cls;
      const outcome = document.getElementById("outcome");
      outcome.hidden = !(cause && cause.tail && cause.tail.length);
      if (!outcome.hidden) outcome.querySelector("pre").textContent = cause.tail.join("\n");
    } else if (seq > 0 || events.length) {
      status.textContent = "live"; status.className = "status live";
    }
  }

  async function poll() {
    try {
      const url = `/api/data?since=${seq}` + (token ? `&token=${encodeURIComponent(token)}` : "");
      const response = await fetch(url, {cache: "no-store"});
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const data = await response.json();
      for (const r of data.records) {
        if (t0 === null || r.t < t0) t0 = r.t;
        (series[r.task] = series[r.task] || []).push(r);
      }
      seq = data.seq;
      lastContact = Date.now() / 1000;
      document.getElementById("run-dir").textContent = data.run_dir;
      drawEvents(data.events);
      drawTables(data.tasks, endedAt !== null ? endedAt : lastContact);
      if (t0 !== null) CHARTS.forEach(drawChart);
      document.getElementById("updated").textContent = (endedAt !== null
        ? "run ended " + new Date(endedAt * 1000).toLocaleTimeString()
        : "updated " + new Date().toLocaleTimeString()) + ` (${seq} reports)` + (seq ? ""
        : " — no worker reports yet: fit reports by itself under stratax launch --dashboard; "
          + "a custom loop calls sx.observe.record(...)");
    } catch (err) {
      // The server is gone (the run ended before this page saw it) or unreachable: keep the
      // last data, say since when, and retry slowly.
      const since = lastContact === null ? "" : " since " + new Date(lastContact * 1000).toLocaleTimeString();
      document.getElementById("updated").textContent = `dashboard server not answering${since} `
        + `(${err}); showing the last data; \`stratax dashboard RUN_DIR\` serves a finished run`;
      setTimeout(poll, 5000);
      return;
    }
    if (endedAt === null) setTimeout(poll, 1000);  // a finished run does not change
  }
  poll();
})();

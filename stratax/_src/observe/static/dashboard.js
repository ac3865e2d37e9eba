// stratax dashboard: polls /api/data and draws with uPlot (vendored). No framework.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token");
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
  const series = {};   // task -> array of records, in arrival order
  const charts = {};   // element id -> {plot, key}
  let seq = 0;
  let t0 = null;

  const fmt = (v, digits) => (v === null || v === undefined || Number.isNaN(v)) ? "–" : Number(v).toFixed(digits);
  const isWorker = (task) => !task.startsWith("ps_");
  const commSeconds = (r) => (r.collective_s != null) ? r.collective_s
    : ((r.pull_s != null || r.push_s != null) ? (r.pull_s || 0) + (r.push_s || 0) : null);
  const share = (part, whole) => (part != null && whole) ? 100 * part / whole : null;

  // One chart: x from xOf(record), y from yOf(record), one line per task that has values.
  const CHARTS = [
    {id: "chart-throughput", title: "Throughput per worker (samples/s) vs wall time (s)", tasks: isWorker,
     x: (r) => r.t - t0, y: (r) => r.samples_per_s},
    {id: "chart-steptime", title: "Step time per worker (ms) vs wall time (s)", tasks: isWorker,
     x: (r) => r.t - t0, y: (r) => r.step_s == null ? null : 1000 * r.step_s},
    {id: "chart-loss-step", title: "Loss vs step", tasks: isWorker,
     x: (r) => r.step, y: (r) => r.loss},
    {id: "chart-loss-time", title: "Loss vs wall time (s)", tasks: isWorker,
     x: (r) => r.t - t0, y: (r) => r.loss},
    {id: "chart-comm", title: "Communication share of the step (%): all-reduce or pull + push", tasks: isWorker,
     x: (r) => r.t - t0, y: (r) => share(commSeconds(r), r.step_s)},
    {id: "chart-ps", title: "Parameter-server load per shard (requests/s)", tasks: (t) => t.startsWith("ps_"),
     x: (r) => r.t - t0, y: (r) => r.requests_per_s},
  ];

  function drawChart(spec) {
    const tasks = Object.keys(series).sort().filter(spec.tasks);
    const tables = [], names = [];
    for (const task of tasks) {
      const xs = [], ys = [];
      let lastX = -Infinity;
      for (const r of series[task]) {
        const x = spec.x(r), y = spec.y(r);
        if (x == null || y == null || Number.isNaN(x) || x <= lastX) continue;
        xs.push(x); ys.push(y); lastX = x;
      }
      if (xs.length) { tables.push([xs, ys]); names.push(task); }
    }
    const el = document.getElementById(spec.id);
    if (!tables.length) return;
    el.hidden = false;
    const data = uPlot.join(tables);
    const key = names.join(",");
    const existing = charts[spec.id];
    if (existing && existing.key === key) { existing.plot.setData(data); return; }
    if (existing) existing.plot.destroy();
    const opts = {
      title: spec.title, width: Math.max(400, el.clientWidth - 16), height: 260,
      scales: {x: {time: false}},
      series: [{label: "x"}].concat(names.map((name, i) => ({
        label: name, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true,
        points: {show: false}}))),
      axes: [{}, {size: 60}],
    };
    charts[spec.id] = {plot: new uPlot(opts, data, el), key: key};
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
      status.textContent = last.exit_code === 0 ? "ended" : `failed (exit ${last.exit_code})`;
      status.className = "status " + (last.exit_code === 0 ? "ended" : "failed");
    } else if (seq > 0) {
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
      document.getElementById("run-dir").textContent = data.run_dir;
      drawTables(data.tasks, Date.now() / 1000);
      drawEvents(data.events);
      if (t0 !== null) CHARTS.forEach(drawChart);
      document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString()
        + ` (${seq} reports)`;
    } catch (err) {
      document.getElementById("updated").textContent = "cannot reach the dashboard server: " + err;
    }
    setTimeout(poll, 1000);
  }
  poll();
})();

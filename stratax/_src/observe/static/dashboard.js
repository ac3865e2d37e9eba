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
  let restarts = [];      // the launcher's restart events: {t, restart (the coming start)}
  let endedAt = null;     // the run's end (s): the page stops polling and ages stop there
  let lastContact = null; // the last answer of the server (s)
  let connected = true;   // false while the server does not answer
  let latest = {};        // task -> its latest values (the tables), redrawn as ages grow
  const PREEMPTED = 42;   // the exit code of a preempted worker (stratax launch restarts it)
  const STALE_S = 10;     // a task's last report older than this is marked stale
  // Line style of each start of the group: canvas dash pattern and the legend's border style.
  const STYLES = [{name: "solid", dash: undefined}, {name: "dashed", dash: [6, 3]},
                  {name: "dotted", dash: [2, 3]}];
  const styleOf = (k) => STYLES[k === 0 ? 0 : 1 + (k - 1) % (STYLES.length - 1)];

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

  // Where each restart shows on a chart, from the launcher's restart event on (before the new
  // start reports): on a time axis a marker at the restart and a band over the gap until the
  // new start's first record (open while it has none); on a step axis a marker at the step the
  // new start resumed from (its first record; until then, the last step reached before).
  function restartMarks(spec) {
    const marks = [], bands = [];
    for (const e of restarts) {
      const k = e.restart;
      let first = null, before = null;  // the new start's first x; the last x of the ones before
      for (const task of Object.keys(series).filter(spec.tasks)) {
        for (const r of series[task]) {
          const x = spec.xLabel === "step" ? r.step : r.t - t0;
          if (x == null) continue;
          const a = attemptOf(r.t);
          if (a === k && (first === null || x < first)) first = x;
          if (a < k && (before === null || x > before)) before = x;
        }
      }
      if (spec.xLabel === "step") {
        const x = first !== null ? first : before;
        if (x !== null) marks.push(x);
      } else {
        marks.push(e.t - t0);
        bands.push([e.t - t0, first]);  // first === null: the gap is still open
      }
    }
    return {marks: marks.sort((a, b) => a - b), bands: bands};
  }

  // Each (task, start) is its own line, solid for the first start, dashed (dotted, ...) for
  // the next ones, as the legend says: the gap between the starts is not bridged.
  function drawChart(spec) {
    const tasks = Object.keys(series).sort().filter(spec.tasks);
    const tables = [], names = [], styles = [];
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
        const style = styleOf(k);
        names.push(starts.length > 1 || restarts.length ? `${task} (start ${k}, ${style.name})` : task);
        styles.push({colour: COLORS[colour % COLORS.length], dash: style.dash, name: style.name});
      }
    });
    const el = document.getElementById(spec.id);
    // One replica has nothing to all-reduce: no chart of zeros.
    if (spec.skipAllZero && tables.every(([, ys]) => ys.every((y) => y === 0))) return;
    if (!tables.length) return;
    el.hidden = false;
    const data = uPlot.join(tables);
    const overlay = restartMarks(spec);
    el.dataset.restarts = overlay.marks.map((x) => +x.toFixed(3)).join(" ");
    const key = names.join(",") + "|" + overlay.marks.join(",");
    const existing = charts[spec.id];
    if (existing && existing.key === key) {
      existing.overlay = overlay;
      existing.plot.setData(data);
      return;
    }
    if (existing) existing.plot.destroy();
    const chart = {key: key, overlay: overlay};
    const opts = {
      title: spec.title, width: Math.max(400, el.clientWidth - 16), height: 260,
      // The x range reaches the restart markers (a restart not yet followed by a record).
      scales: {x: {time: false, range: (u, min, max) => {
        const hi = Math.max(max, ...chart.overlay.marks);
        return hi > max ? [min, hi + 0.05 * (hi - min)] : (min === max ? [min - 1, max + 1] : [min, max]);
      }}},
      series: [{label: spec.xLabel}].concat(names.map((name, i) => ({
        label: name, stroke: styles[i].colour, dash: styles[i].dash, width: 2, spanGaps: true,
        points: {show: false}}))),
      axes: [{}, {size: 80, values: (u, values) => values.map(compact)}],
      // Names only (no "--" values until hovered), each marker in its line's style.
      legend: {live: false, markers: {dash: (u, i) => i > 0 ? styles[i - 1].name : "solid"}},
      hooks: {draw: [(u) => drawRestarts(u, chart.overlay)]},
    };
    chart.plot = new uPlot(opts, data, el);
    charts[spec.id] = chart;
  }

  function drawRestarts(u, overlay) {
    const ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
    ctx.save();
    ctx.fillStyle = "rgba(164, 0, 0, 0.08)";
    for (const [from, to] of overlay.bands) {
      const left = u.valToPos(from, "x", true);
      const right = to === null ? u.bbox.left + u.bbox.width : u.valToPos(to, "x", true);
      if (right > left) ctx.fillRect(left, top, right - left, height);
    }
    ctx.strokeStyle = "#a40000"; ctx.lineWidth = 1; ctx.setLineDash([4, 4]);
    for (const x of overlay.marks) {
      const px = u.valToPos(x, "x", true);
      ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, top + height);
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

  // The tables of the tasks' latest values. Ages count on in the browser (until the run's
  // end) also while the server does not answer; then, or past STALE_S, they are marked stale.
  function drawTables() {
    const now = endedAt !== null ? endedAt : Date.now() / 1000;
    const body = document.querySelector("#workers tbody");
    const psBody = document.querySelector("#servers tbody");
    body.replaceChildren(); psBody.replaceChildren();
    for (const name of Object.keys(latest).sort()) {
      const r = latest[name];
      const age = fmt(now - r.t, 1) + " s ago";
      let tr;
      if (!isWorker(name)) {
        document.getElementById("ps-section").hidden = false;
        tr = row([name, fmt(r.requests_per_s, 1),
          r.bytes_per_s == null ? "–" : fmt(r.bytes_per_s / 1e6, 2), age]);
        psBody.appendChild(tr);
      } else {
        tr = row([name, r.step == null ? "–" : String(r.step), r.step_s == null ? "–" : fmt(1000 * r.step_s, 2),
          fmt(r.samples_per_s, 0), r.input_s == null ? "–" : fmt(share(r.input_s, r.step_s), 1) + " %",
          commSeconds(r) == null ? "–" : fmt(share(commSeconds(r), r.step_s), 1) + " %",
          fmt(r.loss, 4), age], r.straggler ? "straggler" : "");
        tr.dataset.task = name;
        body.appendChild(tr);
      }
      if (endedAt === null && (!connected || now - r.t > STALE_S)) {
        tr.lastChild.className = "stale";
        tr.lastChild.title = connected ? `no report for more than ${STALE_S} s`
          : "the dashboard server does not answer: newer reports may exist";
      }
    }
  }

  // A journal item: its time and kind, a one-line message inline, a longer one (the
  // launcher's summary) kept whole with its newlines; a failure's traceback and output.
  function eventItem(e) {
    const li = document.createElement("li");
    li.className = e.kind;
    let text = `${new Date(e.t * 1000).toLocaleTimeString()} ${e.kind}`;
    if (e.kind === "start") text += ` (start ${e.restart}): ${(e.tasks || []).join(", ")}`;
    else if (e.kind === "end") text += ` (exit ${e.exit_code})`;
    const message = (e.message || "").trimEnd();
    if (e.kind !== "start" && message && !message.includes("\n")) text += `: ${message}`;
    li.append(text);
    if (e.kind !== "start" && message.includes("\n")) li.appendChild(pre(message, "message"));
    if (e.kind === "failure") li.append(...failureDetails(e));
    return li;
  }

  function pre(text, cls) {
    const el = document.createElement("pre");
    el.className = cls;
    el.textContent = text;
    return el;
  }

  // A failure's own words: its whole Python traceback (chained exceptions included), and
  // the output lines it printed after it (all its last lines when it printed no traceback).
  function failureDetails(e) {
    const traceback = e.traceback || [], tail = e.tail || [];
    const out = [];
    let after = tail;
    if (traceback.length) {
      out.push(pre(traceback.join("\n"), "traceback"));
      const end = tail.lastIndexOf(traceback[traceback.length - 1]);
      after = end >= 0 ? tail.slice(end + 1) : tail;
    }
    if (after.length) {
      const label = document.createElement("div");
      label.className = "label";
      label.textContent = traceback.length ? "output after it:" : `last ${after.length} output line(s):`;
      out.push(label, pre(after.join("\n"), "tail"));
    }
    return out;
  }

  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  function drawEvents(events) {
    starts = events.filter((e) => e.kind === "start").map((e) => e.t).sort((a, b) => a - b);
    restarts = events.filter((e) => e.kind === "restart" && e.restart > 0);
    document.getElementById("restart-key").hidden = !restarts.length;
    document.getElementById("events").replaceChildren(...events.map(eventItem));
    const last = events[events.length - 1];
    if (last && last.kind === "end") {
      endedAt = last.t;
      // A run that exits 0 recovered from its failures (the journal keeps them); otherwise
      // the last failure ended it, unless the group was restarted after it (the run then
      // ended otherwise: a timeout, a signal to the launcher).
      const failures = events.filter((e) => e.kind === "failure");
      const lastFailure = failures[failures.length - 1];
      const restartedAt = restarts.length ? restarts[restarts.length - 1].t : -Infinity;
      const cause = last.exit_code !== 0 && lastFailure && lastFailure.t > restartedAt
        ? lastFailure : null;
      let text, cls;
      if (last.exit_code === 0) {
        text = failures.length ? `ended, recovered from ${plural(failures.length, "restart")}` : "ended";
        cls = "ended";
      } else if (last.exit_code === PREEMPTED) { text = `preempted (exit ${PREEMPTED})`; cls = "failed"; }
      else { text = `failed (exit ${last.exit_code})`; cls = "failed"; }
      const why = cause ? cause.message : (last.exit_code !== 0 ? (last.message || "").split("\n")[0] : null);
      setStatus(why ? `${text}: ${why}` : text, cls);
      const outcome = document.getElementById("outcome");
      const details = cause ? failureDetails(cause) : [];
      outcome.hidden = !details.length;
      if (details.length) {
        document.getElementById("outcome-task").textContent = cause.task;
        document.getElementById("outcome-details").replaceChildren(...details);
      }
    } else if (seq > 0 || events.length) {
      setStatus(connected ? "live" : "disconnected", connected ? "live" : "disconnected");
    }
  }

  function setStatus(text, cls) {
    const status = document.getElementById("status");
    status.textContent = text;
    status.className = "status " + cls;
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
      connected = true;
      latest = data.tasks;
      document.getElementById("run-dir").textContent = data.run_dir;
      drawEvents(data.events);
      drawTables();
      if (t0 !== null) CHARTS.forEach(drawChart);
      document.getElementById("updated").textContent = (endedAt !== null
        ? "run ended " + new Date(endedAt * 1000).toLocaleTimeString()
        : "updated " + new Date().toLocaleTimeString()) + ` (${seq} reports)` + (seq ? ""
        : " — no worker reports yet: fit reports by itself under stratax launch --dashboard; "
          + "a custom loop calls sx.observe.record(...)");
    } catch (err) {
      // The server is gone (the run ended before this page saw it) or unreachable: keep the
      // last data, say since when, mark it disconnected, and retry slowly.
      connected = false;
      setStatus("disconnected", "disconnected");
      drawTables();
      const since = lastContact === null ? "" : " since " + new Date(lastContact * 1000).toLocaleTimeString();
      document.getElementById("updated").textContent = `dashboard server not answering${since} `
        + `(${err}); showing the last data; \`stratax dashboard RUN_DIR\` serves a finished run`;
      setTimeout(poll, 5000);
      return;
    }
    if (endedAt === null) setTimeout(poll, 1000);  // a finished run does not change
  }
  // Ages of the last reports keep counting between polls, and while the server is away.
  const ticker = setInterval(() => { if (endedAt !== null) clearInterval(ticker); else drawTables(); }, 1000);
  poll();
})();

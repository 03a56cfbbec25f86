// The dashboard: polls /v1/ui/overview (and /v1/audit/windows) and draws tables and charts.
"use strict";

const REFRESH_MS = 2000;
const AUDIT_REFRESH_MS = 10000;
const AUDIT_SINCE_S = 6 * 3600;
const CHART_SPAN_MS = 5 * 60 * 1000;
const MIN_CHART_SPAN_MS = 60 * 1000;
const TOKEN_KEY = "logbroker.token";
const {drawLineChart, shortNumber} = window.logbrokerCharts;

const seriesOf = {write: {}, read: {}, lag: {}};
let lastAudit = 0;

function $(selector) { return document.querySelector(selector); }

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "—" : String(text);
  if (className) td.className = className;
  return td;
}

function fillTable(id, rows, emptyText, columns) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren();
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell(emptyText, "empty");
    td.colSpan = columns;
    tr.appendChild(td);
    body.appendChild(tr);
  }
  for (const row of rows) body.appendChild(row);
}

function bytes(n) {
  if (n === null || n === undefined) return "—";
  return shortNumber(n) + "B";
}

function rate(value) {
  return value === null || value === undefined ? "—" : value.toFixed(value >= 100 ? 0 : 2);
}

function reportedCell(report) {
  const td = cell(ago(report.reported_ms));
  if (report.stale) {
    const badge = document.createElement("span");
    badge.className = "badge warn";
    badge.textContent = "stale";
    td.append(" ", badge);
  }
  return td;
}

// A damaged partition (its files lost data: an operator restores it) is shown, not hidden:
// a red badge, and the store's reason in the badge's tooltip or next to it.
function damagedBadge(text, reasons) {
  const badge = document.createElement("span");
  badge.className = "badge bad damaged";
  badge.textContent = text;
  if (reasons.length) badge.title = reasons.join("\n");
  return badge;
}

function damagedCount(count) {
  return count === 1 ? "1 damaged partition" : `${count} damaged partitions`;
}

function ago(ms) {
  const s = Math.max(0, (Date.now() - ms) / 1000);
  return s < 60 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(0)} min ago`;
}

function duration(ms) {
  if (ms === null || ms === undefined) return "forever";
  const h = ms / 3600000;
  return h >= 48 ? `${(h / 24).toFixed(0)} d` : h >= 1 ? `${h.toFixed(0)} h` : `${(ms / 60000).toFixed(0)} min`;
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

async function getJson(path) {
  const headers = {};
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const response = await fetch(path, {headers, cache: "no-store"});
  if (response.status === 401 || response.status === 403) {
    const body = await response.json().catch(() => ({}));
    const error = new Error(body.reason || `HTTP ${response.status}`);
    error.needsToken = true;
    throw error;
  }
  return response;
}

function askForToken(reason) {
  // what the refused token could see is not shown to the next one
  forgetSeries();
  fillTable("audit", [], "no audit windows yet", 4);
  $("#audit-note").textContent = "";
  $("#token-form").hidden = false;
  $("#main").hidden = true;
  $("#token-error").textContent = token() ? reason : "";
}

// A chart names only what the latest answer names: a series whose topic or group it no longer
// lists (deleted, or not readable with the token now given) is dropped, not drawn for minutes.
function keepOnly(series, names) {
  for (const name of Object.keys(series)) if (!names.has(name)) delete series[name];
}

function forgetSeries() {
  for (const series of Object.values(seriesOf)) keepOnly(series, new Set());
}

function remember(series, name, time, value) {
  if (value === null || value === undefined) return;
  const points = (series[name] = series[name] || []);
  points.push([time, value]);
  while (points.length && points[0][0] < time - CHART_SPAN_MS) points.shift();
}

// The time the page has points for, at least a minute and at most CHART_SPAN_MS: a page
// opened a moment ago draws lines, not spikes at the right edge.
function chartSpan(series) {
  let oldest = Date.now();
  for (const points of Object.values(series)) if (points.length) oldest = Math.min(oldest, points[0][0]);
  return Math.min(CHART_SPAN_MS, Math.max(MIN_CHART_SPAN_MS, Date.now() - oldest));
}

function showTopics(doc) {
  const rows = [];
  for (const t of doc.topics) {
    const tr = document.createElement("tr");
    tr.dataset.topic = t.name;
    const name = cell(t.name, "name");
    if (t.damaged_partitions) {
      tr.dataset.damaged = String(t.damaged_partitions);
      name.append(" ", damagedBadge(damagedCount(t.damaged_partitions),
        t.partitions.filter((p) => p.damaged).map((p) => `${t.name}/${p.partition}: ${p.damaged}`)));
    }
    tr.append(
      name,
      cell(t.partitions.length, "num"),
      cell(rate(t.write_rate), "num write-rate"),
      cell(t.write_bytes_rate === null ? "—" : bytes(t.write_bytes_rate) + "/s", "num"),
      cell(rate(t.read_rate), "num read-rate"),
      cell(`${t.end_offsets} (${t.retained_offsets})`, "num"),
      cell(bytes(t.size_bytes), "num"),
      cell(`${duration(t.retention_ms)}${t.retention_bytes ? ", " + bytes(t.retention_bytes) : ""}`),
    );
    rows.push(tr);
    remember(seriesOf.write, t.name, doc.now_ms, t.write_rate);
    remember(seriesOf.read, t.name, doc.now_ms, t.read_rate);
  }
  const names = new Set(doc.topics.map((t) => t.name));
  keepOnly(seriesOf.write, names);
  keepOnly(seriesOf.read, names);
  fillTable("topics", rows, "no topics yet", 8);
}

function showGroups(doc) {
  const rows = [];
  const add = (name, kind, topics, members, lag, partitions) => {
    const tr = document.createElement("tr");
    tr.dataset.group = name;
    tr.dataset.kind = kind;
    const topicsCell = cell(topics.join(", "));
    const damaged = partitions.filter((p) => p.damaged);
    if (damaged.length) {
      // their lag is unknown (not counted): the reader cannot read past the damage
      tr.dataset.damaged = String(damaged.length);
      topicsCell.append(" ", damagedBadge(damagedCount(damaged.length),
        damaged.map((p) => `${p.topic}/${p.partition}: ${p.damaged}`)));
    }
    tr.append(cell(name, "name"), cell(kind), topicsCell, cell(members, "num"),
      cell(lag, "num lag"));
    rows.push(tr);
    remember(seriesOf.lag, `${kind} ${name}`, doc.now_ms, lag);
  };
  for (const g of doc.groups) add(g.group, "group", g.topics, g.members, g.lag, g.partitions);
  for (const s of doc.subscriptions) add(s.name, "push", s.topics, null, s.lag, s.partitions);
  keepOnly(seriesOf.lag, new Set([
    ...doc.groups.map((g) => `group ${g.group}`),
    ...doc.subscriptions.map((s) => `push ${s.name}`),
  ]));
  fillTable("groups", rows, "no consumer groups or subscriptions", 5);
}

function showPushClients(doc) {
  const rows = [];
  for (const c of doc.push_clients) {
    for (const f of c.files) {
      const tr = document.createElement("tr");
      tr.dataset.client = c.client;
      tr.dataset.path = f.path;
      const phase = f.errno ? `${f.phase} [${f.errno}]` : f.phase;
      tr.append(cell(c.client), cell(c.host), cell(f.path), cell(f.topic), cell(phase),
        cell(bytes(f.lag_bytes), "num lag"), cell(`${f.lag_s.toFixed(1)} s`, "num"),
        reportedCell(c));
      rows.push(tr);
    }
    if (c.files_left_out) {
      rows.push(leftOutRow(c, `${c.files_left_out} more files, less behind, not shown`, 5));
    }
  }
  fillTable("push-clients", rows, "no push-client has reported", 8);
}

function showMirrors(doc) {
  const rows = [];
  for (const m of doc.mirrors) {
    for (const p of m.partitions) {
      const tr = document.createElement("tr");
      tr.dataset.mirror = m.client;
      tr.append(cell(m.client), cell(m.host), cell(`${p.topic}/${p.partition}`),
        cell(p.position, "num"), cell(p.source_end_offset, "num"), cell(p.lag, "num lag"),
        reportedCell(m));
      rows.push(tr);
    }
    if (m.partitions_left_out) {
      rows.push(leftOutRow(m, `${m.partitions_left_out} more partitions not shown`, 4));
    }
  }
  fillTable("mirrors", rows, "no mirror has reported", 7);
}

// The gateway shows the rows most behind of a client with many; the rest are counted.
function leftOutRow(report, text, span) {
  const tr = document.createElement("tr");
  tr.dataset.leftOut = report.client;
  const td = cell(text, "empty");
  td.colSpan = span;
  tr.append(cell(report.client), cell(report.host), td, reportedCell(report));
  return tr;
}

function showDisk(doc) {
  const disk = $("#disk");
  disk.replaceChildren();
  if (doc.disk) {
    // As df counts it: the blocks reserved for root are not room this gateway can write in.
    const room = doc.disk.used_bytes + doc.disk.free_bytes;
    const used = room > 0 ? doc.disk.used_bytes / room : 0;
    const text = document.createElement("p");
    text.id = "disk-use";
    text.textContent = `${doc.disk.path || "data directory"}: ${bytes(doc.disk.used_bytes)} used of ${bytes(doc.disk.total_bytes)} ` +
      `(${(used * 100).toFixed(1)}%), ${bytes(doc.disk.free_bytes)} free`;
    const bar = document.createElement("div");
    bar.className = "bar";
    const fill = document.createElement("div");
    fill.style.width = `${(used * 100).toFixed(1)}%`;
    bar.appendChild(fill);
    disk.append(text, bar);
  } else {
    const text = document.createElement("p");
    text.className = "muted";
    text.textContent = `the ${doc.store} store's disks are the brokers': see their metrics`;
    disk.appendChild(text);
  }
  const rows = [];
  for (const t of doc.topics) {
    for (const p of t.partitions) {
      const tr = document.createElement("tr");
      tr.dataset.partition = `${t.name}/${p.partition}`;
      const name = cell(`${t.name}/${p.partition}`);
      if (p.damaged) {
        tr.dataset.damaged = "1";
        const reason = document.createElement("div");
        reason.className = "reason";
        reason.textContent = p.damaged;
        name.append(" ", damagedBadge("damaged", []), reason);
      }
      tr.append(name, cell(p.start_offset, "num"), cell(p.end_offset, "num"),
        cell(bytes(p.size_bytes), "num"), cell(p.segments ?? "—", "num"));
      rows.push(tr);
    }
  }
  fillTable("partitions", rows, "no partitions", 5);
}

async function refreshAudit() {
  const since = Math.floor(Date.now() / 1000) - AUDIT_SINCE_S;
  const note = $("#audit-note");
  let response;
  try {
    response = await getJson(`/v1/audit/windows?topic=*&since=${since}`);
  } catch (error) {
    note.textContent = `audit: ${error.message}`;
    fillTable("audit", [], "the audit cannot be read", 4);
    return;
  }
  if (response.status === 404) {
    note.textContent = "audit not configured";
    fillTable("audit", [], "audit not configured", 4);
    return;
  }
  if (!response.ok) {
    note.textContent = `audit answered HTTP ${response.status}`;
    return;
  }
  const doc = await response.json();
  const windows = doc.windows || [];
  const incomplete = windows.filter((w) => !w.complete).length;
  note.textContent = `${windows.length} windows in the last ${AUDIT_SINCE_S / 3600} h, ${incomplete} incomplete`;
  const rows = windows.slice().reverse().map((w) => {
    const tr = document.createElement("tr");
    tr.dataset.topic = w.topic;
    const tiers = Object.entries(w.tiers || {})
      .map(([tier, c]) => `${tier} ${c.messages} / ${c.lines}`).join(" · ");
    const badge = document.createElement("span");
    badge.className = `badge ${w.complete ? "ok" : "bad"}`;
    badge.textContent = w.complete ? "complete" : "incomplete";
    const done = cell("");
    done.appendChild(badge);
    tr.append(cell(w.topic), cell(new Date(w.window_start * 1000).toISOString().slice(0, 16).replace("T", " ")),
      cell(tiers), done);
    return tr;
  });
  fillTable("audit", rows, "no audit windows yet", 4);
}

async function refresh() {
  const status = $("#status");
  try {
    const response = await getJson("/v1/ui/overview");
    if (!response.ok) throw new Error(`overview answered HTTP ${response.status}`);
    const doc = await response.json();
    $("#token-form").hidden = true;
    $("#main").hidden = false;
    $("#forget-token").hidden = !token();
    $("#dc").textContent = `${doc.dc} · ${doc.store} store · rates over ${doc.window_s} s`;
    showTopics(doc);
    showGroups(doc);
    showPushClients(doc);
    showMirrors(doc);
    showDisk(doc);
    drawLineChart($("#chart-write"), seriesOf.write, chartSpan(seriesOf.write));
    drawLineChart($("#chart-read"), seriesOf.read, chartSpan(seriesOf.read));
    drawLineChart($("#chart-lag"), seriesOf.lag, chartSpan(seriesOf.lag));
    if (Date.now() - lastAudit >= AUDIT_REFRESH_MS) {
      lastAudit = Date.now();
      await refreshAudit();
    }
    status.className = "status";
    status.textContent = `updated ${new Date(doc.now_ms).toLocaleTimeString()}`;
    document.body.dataset.updated = String(doc.now_ms);
  } catch (error) {
    if (error.needsToken) {
      askForToken(error.message);
    } else {
      status.className = "status error";
      status.textContent = `cannot refresh: ${error.message}`;
    }
  }
}

$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token-input").value.trim());
  $("#token-input").value = "";
  lastAudit = 0;
  refresh();
});

$("#forget-token").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  location.reload();
});

async function loop() {
  await refresh();
  setTimeout(loop, REFRESH_MS);
}
loop();

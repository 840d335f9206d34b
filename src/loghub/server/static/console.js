// The LogHub console: reads /console/api/overview every REFRESH_MS and redraws the tables
// and the ingest-rate chart. Rates are differences of the server's ingest totals between two
// reads; the chart keeps the last HISTORY_MAX of them. Values from the server are set with
// textContent only, never parsed as HTML.
"use strict";

const REFRESH_MS = 2000;
const HISTORY_MAX = 90;
const COLORS = ["#2f6fdb", "#d9480f", "#2b8a3e", "#9c36b5", "#e67700", "#0b7285", "#c2255c"];

let previous = null; // the last overview read, for rates
const history = []; // [{timeMs, rates: {key: logsPerSecond}}]

function key(store) {
  return store.project + "/" + store.name;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function fill(tableId, rows) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren(...rows);
  if (rows.length === 0) {
    const tr = document.createElement("tr");
    const td = cell(tr, "none", "muted");
    td.colSpan = 9;
    body.appendChild(tr);
  }
}

function rates(now) {
  const result = {};
  if (previous === null) return result;
  const seconds = (now.timeMs - previous.timeMs) / 1000;
  if (seconds <= 0) return result;
  const before = new Map(previous.logstores.map((s) => [key(s), s]));
  for (const store of now.logstores) {
    const old = before.get(key(store));
    if (!old) continue;
    result[key(store)] = {
      logs: Math.max(0, store.ingestLogsTotal - old.ingestLogsTotal) / seconds,
      bytes: Math.max(0, store.ingestBytesTotal - old.ingestBytesTotal) / seconds,
    };
  }
  return result;
}

function renderLogstores(data, rate) {
  fill("logstores", data.logstores.map((store) => {
    const tr = document.createElement("tr");
    tr.dataset.logstore = key(store);
    const r = rate[key(store)];
    cell(tr, store.project);
    cell(tr, store.name);
    cell(tr, store.shards.length, "num");
    cell(tr, bytes(store.sizeBytes), "num size");
    cell(tr, r ? r.logs.toFixed(1) : "…", "num rate");
    cell(tr, r ? bytes(r.bytes) + "/s" : "…", "num");
    cell(tr, store.ttlDays + " d", "num");
    return tr;
  }));
}

function renderShards(data) {
  const rows = [];
  for (const store of data.logstores) {
    for (const shard of store.shards) {
      const tr = document.createElement("tr");
      tr.className = "shard";
      tr.dataset.logstore = key(store);
      tr.dataset.shard = shard.shardId;
      let lineage = "";
      if (shard.parents.length) lineage += "from " + shard.parents.join(", ");
      if (shard.children.length) lineage += (lineage ? "; " : "") + "into " + shard.children.join(", ");
      cell(tr, key(store));
      cell(tr, shard.shardId, "num");
      cell(tr, shard.status, "status");
      cell(tr, shard.beginKey.slice(0, 8) + "… – " + shard.endKey.slice(0, 8) + "…");
      cell(tr, lineage || "—", "lineage");
      cell(tr, shard.endSeq - shard.beginSeq, "num");
      cell(tr, bytes(shard.sizeBytes), "num");
      rows.push(tr);
    }
  }
  fill("shards", rows);
}

function renderGroups(data) {
  const rows = [];
  for (const store of data.logstores) {
    for (const group of store.groups) {
      for (const shard of group.shards) {
        const tr = document.createElement("tr");
        tr.className = "group-shard" + (shard.lagLogGroups > 0 ? " lagging" : "");
        tr.dataset.logstore = key(store);
        tr.dataset.group = group.name;
        tr.dataset.shard = shard.shardId;
        cell(tr, key(store));
        cell(tr, group.name);
        cell(tr, shard.shardId, "num");
        cell(tr, shard.state, "state");
        cell(tr, shard.owner || "—", "owner");
        cell(tr, shard.checkpointSeq, "num checkpoint");
        cell(tr, shard.endSeq, "num");
        cell(tr, shard.lagLogGroups, "num lag lag-groups");
        cell(tr, shard.lagSeconds.toFixed(1), "num lag lag-seconds");
        rows.push(tr);
      }
    }
  }
  fill("groups", rows);
}

function drawChart() {
  const canvas = document.getElementById("chart");
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 32;
  ctx.clearRect(0, 0, w, h);
  const keys = [...new Set(history.flatMap((point) => Object.keys(point.rates)))].sort();
  let top = 1;
  for (const point of history) for (const k of keys) top = Math.max(top, point.rates[k] || 0);
  ctx.strokeStyle = "#d0d5dd";
  ctx.fillStyle = "#7a8394";
  ctx.font = "11px system-ui, sans-serif";
  for (let i = 0; i <= 4; i++) {
    const y = h - pad / 2 - (i / 4) * (h - pad);
    ctx.beginPath(); ctx.moveTo(pad + 20, y); ctx.lineTo(w - 4, y); ctx.stroke();
    ctx.fillText(((top * i) / 4).toFixed(0), 2, y + 4);
  }
  // the newest point at the right edge; the first reads spread over the whole width
  const x = (i) => pad + 20 + (i / Math.max(1, history.length - 1)) * (w - pad - 24);
  const legend = document.getElementById("legend");
  legend.replaceChildren();
  keys.forEach((k, n) => {
    const color = COLORS[n % COLORS.length];
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    history.forEach((point, i) => {
      const y = h - pad / 2 - ((point.rates[k] || 0) / top) * (h - pad);
      if (i === 0) ctx.moveTo(x(i), y); else ctx.lineTo(x(i), y);
    });
    ctx.stroke();
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = color;
    item.append(swatch, k);
    legend.appendChild(item);
  });
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const reply = await fetch("/console/api/overview", { cache: "no-store" });
    if (!reply.ok) throw new Error("HTTP " + reply.status);
    const data = await reply.json();
    const rate = rates(data);
    if (previous !== null) {
      const point = { timeMs: data.timeMs, rates: {} };
      for (const [k, r] of Object.entries(rate)) point.rates[k] = r.logs;
      history.push(point);
      if (history.length > HISTORY_MAX) history.shift();
    }
    previous = data;
    renderLogstores(data, rate);
    renderShards(data);
    renderGroups(data);
    drawChart();
    status.className = "";
    status.textContent = "updated " + new Date(data.timeMs).toLocaleTimeString() +
      " · disk free " + bytes(data.diskFreeBytes);
    document.body.dataset.refreshed = String(data.timeMs);
  } catch (error) {
    status.className = "stale";
    status.textContent = "cannot reach the server (" + error.message + "); retrying";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  refresh();
  setInterval(refresh, REFRESH_MS);
});

// eventlog console: one ES module, no library. Every view is drawn from the public HTTP API
// (the same requests as curl or an SDK); nothing here is loaded from elsewhere.
//
// Record values are shown with textContent only (never parsed as HTML): whatever a producer
// wrote cannot run in an operator's browser. The page's Content-Security-Policy (api/console.py)
// allows only this file and this server.

const TOKEN_KEY = "eventlog-token"; // shared with /docs and /redoc: one token per browser tab
const main = document.getElementById("view");
const banner = document.getElementById("banner");
let me = null; // GET /v1/whoami: the token's role and what it may do
let cleanups = []; // what the current view must stop when the page moves on (streams, timers)

// Each route draws into an element of its own, so a slow view the user already left (its
// requests still running) draws nowhere, and stops its streams and timers as it starts them.
function onLeave(target, stop) {
  if (target.isConnected) cleanups.push(stop);
  else stop();
}

// -- DOM ---------------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name === "value" || name === "checked" || name === "disabled" || name === "hidden") el[name] = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

// an element's children replaced; null, undefined and false are skipped (as in h)
function put(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

// a table scrolls sideways inside its own box (never wider than its panel, at any width)
function table(headers, rows, attrs) {
  return h("div", { class: "scroll" }, h("table", attrs,
    h("thead", null, h("tr", null, headers.map((c) => (c.startsWith("#") ? h("th", { class: "num" }, c.slice(1)) : h("th", null, c))))),
    h("tbody", null, rows.length ? rows : h("tr", null, h("td", { colspan: headers.length, class: "muted" }, "none")))));
}

const num = (value) => h("td", { class: "num" }, value === null || value === undefined ? "–" : fmtInt(value));
const fmtInt = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : String(n));
const topicHref = (topic) => `#/topics/${encodeURIComponent(topic)}`;

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

// One zone for every time the console shows and every picker it reads: the browser's own
// ("Local", the default, as an operator reads a clock) or UTC (as the API's timestamps and
// Kafka's tools), chosen with the header's Local / UTC switch and kept in localStorage. A time
// shown always names its zone ("EST", "GMT+1", "UTC"), and its title gives it in the other one
// (UTC on hover of a local time), so a time copied from the API is found whichever is chosen.
const ZONE_KEY = "eventlog-time-zone";
let zone = localStorage.getItem(ZONE_KEY) === "utc" ? "utc" : "local";
const BROWSER_ZONE = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";
const pad = (n, width = 2) => String(n).padStart(width, "0");

// the zone's abbreviation at that instant as the browser names it (EST/EDT, GMT+1, ...)
function zoneAbbr(ms) {
  const part = new Intl.DateTimeFormat("en-US", { timeZoneName: "short" }).formatToParts(new Date(ms)).find((x) => x.type === "timeZoneName");
  return part ? part.value : BROWSER_ZONE;
}

function timeIn(ms, which) {
  if (ms === null || ms === undefined || ms < 0) return "–";
  const d = new Date(ms);
  if (which === "utc") return d.toISOString().replace("T", " ").replace("Z", " UTC");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)} ${zoneAbbr(ms)}`;
}

const fmtTime = (ms) => timeIn(ms, zone);
// the same instant in the other zone, for a title (hover)
const otherTime = (ms) => (ms === null || ms === undefined || ms < 0 ? null : timeIn(ms, zone === "utc" ? "local" : "utc"));
const zoneName = () => (zone === "utc" ? "UTC" : BROWSER_ZONE);
const timeCell = (ms) => h("td", { class: "mono time", title: otherTime(ms) }, fmtTime(ms));
const timeSpan = (ms) => h("span", { class: "time", title: otherTime(ms) }, fmtTime(ms));

// a datetime-local picker's value ("2026-01-01T00:30" or with seconds), read in the zone shown
// (without a "Z" the Date parser reads it in the browser's zone)
function picked(value, which = zone) {
  const full = value.length === 16 ? `${value}:00` : value;
  return new Date(which === "utc" ? `${full}Z` : full).getTime();
}

// an instant as a datetime-local picker's value in `which` zone (seconds kept: the pickers step 1 s)
function pickerValue(ms, which = zone) {
  const d = new Date(ms);
  if (which === "utc") return d.toISOString().slice(0, 19);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

// the switch: the view is drawn again in the other zone; a time picked into the address (a jump
// to a time) is rewritten into the new zone, so the page stays on the same instant
function setZone(which) {
  if (which === zone) return;
  const [path, query] = location.hash.split("?");
  const params = new URLSearchParams(query || "");
  for (const key of ["time", "from_time"]) {
    const value = params.get(key);
    if (value && !Number.isNaN(picked(value))) params.set(key, pickerValue(picked(value), which));
  }
  zone = which;
  localStorage.setItem(ZONE_KEY, which);
  showZone();
  const hash = query === undefined ? path : `${path}?${params}`;
  go(hash || "#/topics");
}

function showZone() {
  for (const button of document.querySelectorAll("#zone-switch button")) {
    button.setAttribute("aria-pressed", String(button.dataset.zone === zone));
    button.classList.toggle("active", button.dataset.zone === zone);
  }
  document.getElementById("zone-switch").title = `times shown in ${zone === "utc" ? "UTC" : `your browser's zone (${BROWSER_ZONE})`}; the other one on hover`;
}

function fmtMs(ms) {
  if (ms === null || ms === undefined || ms === "") return "–";
  ms = Number(ms);
  if (ms < 0) return "forever";
  const units = [["d", 86400000], ["h", 3600000], ["min", 60000], ["s", 1000]];
  for (const [unit, size] of units) if (ms >= size && ms % size === 0) return `${ms / size} ${unit}`;
  return `${ms} ms`;
}

function result(el, text, ok = true) {
  el.className = `result ${ok ? "ok" : "error"}`;
  el.textContent = text;
}

// an error stays until the next view loads; a note ("topic deleted") is shown on the next one too
function showBanner(text, kind = "error") {
  banner.textContent = text;
  banner.className = kind === "info" ? "info" : "";
  banner.dataset.keep = kind === "info" ? "1" : "";
  banner.hidden = !text;
}

// a <dialog> asking to type `word` before something that cannot be undone
function confirmTyped(question, word) {
  return new Promise((resolve) => {
    const input = h("input", { "aria-label": `type ${word} to confirm`, name: "confirm-word" });
    const go = h("button", { class: "danger", type: "submit", disabled: true }, "Delete");
    const dialog = h("dialog", null,
      h("form", { method: "dialog" },
        h("p", null, question),
        h("p", null, "Type ", h("b", null, word), " to confirm."),
        input,
        h("div", { class: "toolbar spaced" }, go, h("button", { type: "button", onclick: () => dialog.close("") }, "Cancel"))));
    input.addEventListener("input", () => { go.disabled = input.value !== word; });
    go.addEventListener("click", () => { dialog.returnValue = "yes"; });
    dialog.addEventListener("close", () => { dialog.remove(); resolve(dialog.returnValue === "yes"); });
    document.body.append(dialog);
    dialog.showModal();
    input.focus();
  });
}

// -- the API -----------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
  get text() {
    const p = this.problem;
    return `${this.status} ${p.code || p.title || ""}: ${p.detail || p.title || "request failed"}`;
  }
}

function authHeaders(headers = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { ...headers, Authorization: `Bearer ${token}` } : { ...headers };
}

async function api(method, path, body, options = {}) {
  const headers = authHeaders(options.headers);
  let payload;
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const response = await fetch(path, { method, headers, body: payload, signal: options.signal });
  if (options.raw) return response;
  if (!response.ok) {
    let problem = {};
    try { problem = await response.json(); } catch { problem = { title: response.statusText }; }
    throw new ApiError(response.status, problem);
  }
  if (response.status === 204) return null;
  const type = response.headers.get("content-type") || "";
  return type.includes("json") ? response.json() : response.text();
}

const get = (path, options) => api("GET", path, undefined, options);
const can = (action) => !!me && me.actions.includes(action);
const q = (params) => new URLSearchParams(Object.entries(params).filter(([, v]) => v !== null && v !== undefined && v !== "")).toString();

// server-sent events over fetch (EventSource cannot send an Authorization header)
async function* events(path, signal) {
  const response = await api("GET", path, undefined, { raw: true, signal, headers: { Accept: "text/event-stream" } });
  if (!response.ok) {
    let problem = {};
    try { problem = await response.json(); } catch { problem = { title: response.statusText }; }
    throw new ApiError(response.status, problem);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = { event: "message", data: "", id: null };
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let text = colon < 0 ? "" : line.slice(colon + 1);
        if (text.startsWith(" ")) text = text.slice(1);
        if (field === "data") event.data += (event.data ? "\n" : "") + text;
        else if (field === "event") event.event = text;
        else if (field === "id") event.id = text;
      }
      if (event.data) yield event;
    }
  }
}

// -- values: the API sends bytes as base64; shown as text, JSON or hex -------------------------

function bytesOf(b64) {
  if (b64 === null || b64 === undefined) return null;
  const raw = atob(b64);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

function base64Of(text) {
  let raw = "";
  for (const byte of new TextEncoder().encode(text)) raw += String.fromCharCode(byte);
  return btoa(raw);
}

function textOf(bytes) {
  try { return utf8.decode(bytes); } catch { return null; }
}

function hexOf(bytes) {
  const parts = [];
  for (let i = 0; i < bytes.length; i += 16) {
    const line = bytes.slice(i, i + 16);
    const row = Array.from(line, (b) => b.toString(16).padStart(2, "0")).join(" ").padEnd(47);
    const ascii = Array.from(line, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : ".")).join("");
    parts.push(`${i.toString(16).padStart(6, "0")}  ${row}  |${ascii}|`);
  }
  return parts.join("\n");
}

// as: auto | text | json | hex
function renderBytes(b64, as) {
  const bytes = bytesOf(b64);
  if (bytes === null) return h("span", { class: "tombstone" }, "null");
  const text = textOf(bytes);
  if (as === "hex" || (text === null && as !== "text")) return h("pre", { class: "hex" }, hexOf(bytes) || "(empty)");
  if (as === "text") return h("pre", null, text === null ? new TextDecoder().decode(bytes) : text);
  const trimmed = text.trim();
  if (as === "json" || trimmed.startsWith("{") || trimmed.startsWith("[")) {
    try { return h("pre", { class: "json" }, JSON.stringify(JSON.parse(text), null, 2)); } catch { /* not JSON */ }
  }
  return h("pre", null, text === "" ? "(empty)" : text);
}

function renderHeaders(headers, as) {
  if (!headers || !headers.length) return h("span", { class: "muted" }, "–");
  return h("div", null, headers.map((header) => {
    const bytes = bytesOf(header.value);
    const text = bytes === null ? null : textOf(bytes);
    const shown = bytes === null ? h("span", { class: "tombstone" }, "null")
      : (as === "hex" || text === null) ? h("code", null, hexOf(bytes)) : h("code", null, text);
    return h("div", null, h("b", null, header.key), ": ", shown);
  }));
}

function recordRows(records, as, withPartition) {
  return records.map((r) => h("tr", { dataset: { offset: r.offset } },
    h("td", { class: "num mono" }, String(r.offset)),
    withPartition !== undefined ? h("td", { class: "num" }, String(withPartition)) : null,
    timeCell(r.timestamp),
    h("td", { class: "key" }, renderBytes(r.key, as === "hex" ? "hex" : "auto")),
    h("td", { class: "value" }, renderBytes(r.value, as)),
    h("td", { class: "headers mono" }, renderHeaders(r.headers, as))));
}

// -- topics ------------------------------------------------------------------------------------

const POLICIES = ["delete", "compact", "compact,delete"];

async function viewTopics(target, _match, params) {
  const internal = params.get("internal") === "true";
  const listing = await get(`/v1/topics?${q({ internal: internal ? "true" : null })}`);
  const details = await Promise.all(listing.topics.map((t) =>
    get(`/v1/topics/${encodeURIComponent(t.name)}`).catch((error) => ({ name: t.name, error }))));
  const rows = details.map((t) => {
    if (t.error) return h("tr", null, h("td", null, t.name), h("td", { colspan: 6, class: "muted" }, t.error.text || String(t.error)));
    const parts = t.partitions;
    const size = parts.reduce((s, p) => s + (p.size_bytes || 0), 0);
    const messages = parts.reduce((s, p) => s + Math.max(0, (p.high_watermark || 0) - (p.log_start_offset || 0)), 0);
    const policy = t.configs["cleanup.policy"];
    return h("tr", { dataset: { topic: t.name } },
      h("td", null, h("a", { href: topicHref(t.name) }, t.name), t.internal ? h("span", { class: "tag" }, "internal") : null),
      num(parts.length), h("td", { class: "num" }, fmtBytes(size)), num(messages),
      h("td", null, policy.split(",").map((p) => h("span", { class: `tag ${p === "compact" ? "compact" : ""}` }, p))),
      h("td", null, fmtMs(t.configs["retention.ms"])),
      h("td", null, can("read") ? [h("a", { href: `${topicHref(t.name)}/records` }, "records"), " · ", h("a", { href: `${topicHref(t.name)}/tail` }, "tail")] : null));
  });
  const toggle = h("label", { class: "check" },
    h("input", { type: "checkbox", checked: internal, onchange: (e) => go(`#/topics${e.target.checked ? "?internal=true" : ""}`) }), "internal topics");
  put(target, 
    h("h1", null, "Topics", h("span", { class: "sub" }, `${listing.topics.length} topic${listing.topics.length === 1 ? "" : "s"}`)),
    can("admin") ? createTopicPanel() : null,
    h("section", { class: "panel" },
      h("div", { class: "toolbar" }, can("admin") ? toggle : null, h("span", { class: "muted" }, "Messages: high watermark − log start, per partition (compaction leaves gaps).")),
      table(["Name", "#Partitions", "#Size", "#Messages", "Cleanup policy", "Retention", ""], rows, { id: "topics" })));
}

function createTopicPanel() {
  const out = h("div");
  const form = h("form", { class: "inline", id: "create-topic" },
    h("label", null, "Name", h("input", { name: "name", required: true, pattern: "[a-zA-Z0-9._\\-]{1,249}", placeholder: "orders" })),
    h("label", null, "Partitions", h("input", { name: "partitions", type: "number", min: 1, value: "1", class: "narrow" })),
    // blank: the server's default, sent as nothing (only what the user chose is set on the topic)
    h("label", null, "Cleanup policy", h("select", { name: "policy" }, h("option", { value: "" }, "default (delete)"),
      POLICIES.map((p) => h("option", { value: p }, p)))),
    h("label", null, "retention.ms (blank: default 7 days, -1: forever)", h("input", { name: "retention", type: "number", min: -1, class: "medium" })),
    h("label", null, "Other configs (name=value per line)", h("textarea", { name: "configs", rows: 1, class: "short wide", placeholder: "segment.bytes=1048576" })),
    h("button", { class: "primary", type: "submit" }, "Create topic"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    let configs;
    try { configs = parseConfigs(data.get("configs")); } catch (error) { result(out, error.message, false); return; }
    if (data.get("policy")) configs["cleanup.policy"] = data.get("policy");
    if (data.get("retention") !== "") configs["retention.ms"] = data.get("retention");
    try {
      const topic = await api("POST", "/v1/topics", { name: data.get("name").trim(), partitions: Number(data.get("partitions")), configs });
      go(topicHref(topic.name));
    } catch (error) { result(out, error.text || String(error), false); }
  });
  return h("section", { class: "panel" }, h("h2", null, "Create a topic"), form, out);
}

function parseConfigs(text) {
  const configs = {};
  for (const line of (text || "").split("\n")) {
    if (!line.trim()) continue;
    const eq = line.indexOf("=");
    if (eq < 1) throw new Error(`"${line.trim()}": expected name=value`);
    configs[line.slice(0, eq).trim()] = line.slice(eq + 1).trim();
  }
  return configs;
}

// the topic page's partitions table (drawn again after a produce from the form: fresh numbers)
function partitionsTable(name, topic) {
  const partitions = topic.partitions.map((p) => (p.offline
    ? h("tr", null, num(p.partition), h("td", { colspan: 5 }, h("span", { class: "tag error" }, "offline"), " ", p.error || ""))
    : h("tr", { dataset: { partition: p.partition } },
      h("td", { class: "num" }, h("a", { href: `${topicHref(name)}/partitions/${p.partition}` }, String(p.partition))),
      num(p.log_start_offset), num(p.high_watermark), num(p.high_watermark - p.log_start_offset), num(p.segments),
      h("td", { class: "num" }, fmtBytes(p.size_bytes)))));
  return table(["#Partition", "#Log start", "#High watermark", "#Messages", "#Segments", "#Size"], partitions, { id: "partitions" });
}

async function viewTopic(target, [, name]) {
  const topic = await get(`/v1/topics/${encodeURIComponent(name)}`);
  const configRows = Object.entries(topic.configs).sort().map(([key, value]) => h("tr", null,
    h("td", { class: "mono" }, key), h("td", { class: "mono" }, value),
    h("td", null, key in topic.overrides ? h("span", { class: "tag" }, "set on topic") : h("span", { class: "muted" }, "default"))));
  const actions = h("div", { class: "toolbar" },
    can("read") ? h("a", { href: `${topicHref(name)}/records` }, h("button", { type: "button" }, "Browse records")) : null,
    can("read") ? h("a", { href: `${topicHref(name)}/tail` }, h("button", { type: "button" }, "Live tail")) : null,
    can("admin") ? h("button", { class: "danger", type: "button", id: "delete-topic", onclick: () => deleteTopic(name) }, "Delete topic") : null);
  put(target, 
    h("div", { class: "crumbs" }, h("a", { href: "#/topics" }, "Topics"), " / "),
    h("h1", null, name, h("span", { class: "sub mono" }, topic.topic_id), topic.internal ? h("span", { class: "tag" }, "internal") : null),
    actions,
    h("div", { class: "grid" },
      h("section", { class: "panel wide-panel" }, h("h2", null, "Partitions"),
        partitionsTable(name, topic),
        can("admin") ? addPartitionsForm(name, topic.partitions.length) : null),
      can("write") ? producePanel(name, topic.partitions.length) : null,
      can("read") ? keyLookupPanel(name) : null,
      h("section", { class: "panel wide-panel" }, h("h2", null, "Configs"),
        table(["Name", "Value", ""], configRows, { id: "configs" }),
        can("admin") ? alterConfigForm(name) : null)));
}

async function deleteTopic(name) {
  if (!(await confirmTyped(`Delete topic ${name} and all its records? This cannot be undone.`, name))) return;
  try {
    await api("DELETE", `/v1/topics/${encodeURIComponent(name)}`);
    showBanner(`Topic ${name} deleted.`, "info");
    go("#/topics");
  } catch (error) { showBanner(error.text || String(error)); }
}

function addPartitionsForm(name, count) {
  const out = h("div");
  const form = h("form", { class: "inline spaced", id: "add-partitions" },
    // pre-filled with the count there is now (raise it: submitting it unchanged is refused)
    h("label", null, `Partitions in all (now ${count}; only grows)`,
      h("input", { name: "count", type: "number", min: count + 1, value: String(count), class: "narrow" })),
    h("button", { type: "submit" }, "Add partitions"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await api("POST", `/v1/topics/${encodeURIComponent(name)}/partitions`, { count: Number(new FormData(form).get("count")) });
      route();
    } catch (error) { result(out, error.text || String(error), false); }
  });
  return h("div", null, form, out);
}

const KNOWN_CONFIGS = ["cleanup.policy", "retention.ms", "retention.bytes", "segment.bytes", "segment.ms", "max.message.bytes",
  "min.compaction.lag.ms", "max.compaction.lag.ms", "delete.retention.ms", "min.cleanable.dirty.ratio", "message.timestamp.type",
  "flush.messages", "flush.ms", "segment.index.bytes", "index.interval.bytes", "file.delete.delay.ms", "eventlog.key.index"];

function alterConfigForm(name) {
  const out = h("div");
  const form = h("form", { class: "inline spaced", id: "alter-configs" },
    h("label", null, "Config", h("input", { name: "key", list: "known-configs", required: true, placeholder: "retention.ms" })),
    h("datalist", { id: "known-configs" }, KNOWN_CONFIGS.map((c) => h("option", { value: c }))),
    h("label", null, "Value", h("input", { name: "value", required: true })),
    h("button", { type: "submit" }, "Set config"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    try {
      await api("PATCH", `/v1/topics/${encodeURIComponent(name)}/configs`, { configs: { [data.get("key").trim()]: data.get("value").trim() } });
      route();
    } catch (error) { result(out, error.text || String(error), false); }
  });
  return h("div", null, form, out);
}

function producePanel(name, partitions) {
  const out = h("div", { id: "produce-result" });
  const headerRows = h("div", { class: "headers-editor" });
  const addHeader = () => headerRows.append(h("div", { class: "row" },
    h("input", { name: "header-key", placeholder: "header name" }), h("input", { name: "header-value", placeholder: "value" }),
    h("button", { type: "button", onclick: (e) => e.target.parentElement.remove() }, "×")));
  const form = h("form", { id: "produce" },
    h("div", { class: "toolbar" },
      h("label", null, "Key (blank: none)", h("input", { name: "key", placeholder: "order-17" })),
      h("label", null, "Partition", h("select", { name: "partition" },
        h("option", { value: "" }, "by key (murmur2)"),
        Array.from({ length: partitions }, (_, i) => h("option", { value: String(i) }, String(i))))),
      h("label", null, "Value is", h("select", { name: "format" }, h("option", { value: "string" }, "text"), h("option", { value: "json" }, "JSON"))),
      h("label", { class: "check" }, h("input", { type: "checkbox", name: "tombstone" }), "null value (tombstone)")),
    h("label", null, "Value", h("textarea", { name: "value", placeholder: '{"status": "paid"}' })),
    h("div", { class: "spaced" }, headerRows, h("button", { type: "button", onclick: addHeader }, "Add header")),
    h("button", { class: "primary", type: "submit" }, "Produce"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    // every value and header value is sent as base64 of its UTF-8 bytes: JSON is checked here and
    // stored as the text typed, and header values stay plain text whatever the value is
    const record = { key: data.get("key") === "" ? null : data.get("key") };
    if (data.get("tombstone")) record.value = null;
    else {
      if (data.get("format") === "json") {
        try { JSON.parse(data.get("value")); } catch (error) { result(out, `The value is not JSON: ${error.message}`, false); return; }
      }
      record.value = base64Of(data.get("value"));
    }
    const keys = data.getAll("header-key"), values = data.getAll("header-value");
    record.headers = keys.map((key, i) => ({ key, value: base64Of(values[i]) })).filter((header) => header.key !== "");
    if (data.get("partition") !== "") record.partition = Number(data.get("partition"));
    try {
      const answer = await api("POST", `/v1/topics/${encodeURIComponent(name)}/records`, { records: [record], key_format: "string", value_format: "base64" });
      const o = answer.offsets[0];
      put(out, h("span", { class: "result ok" }, `Written: partition ${o.partition}, offset ${o.offset}, `, timeSpan(o.timestamp), " · "),
        h("a", { href: `${topicHref(name)}/records?${q({ partition: o.partition, offset: o.offset })}` }, "show it"));
      const shown = document.getElementById("partitions");
      if (shown) shown.closest(".scroll").replaceWith(partitionsTable(name, await get(`/v1/topics/${encodeURIComponent(name)}`)));
    } catch (error) { result(out, error.text || String(error), false); }
  });
  return h("section", { class: "panel" }, h("h2", null, "Produce a record"), form, out);
}

function keyLookupPanel(name) {
  const form = h("form", { class: "inline", id: "key-lookup" },
    h("label", null, "Key", h("input", { name: "key", required: true, placeholder: "order-17" })),
    h("button", { type: "submit" }, "Show the key's records"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    go(`${topicHref(name)}/records?${q({ mode: "key", key: new FormData(form).get("key") })}`);
  });
  return h("section", { class: "panel" }, h("h2", null, "A key's stream"),
    h("p", { class: "muted" }, "Every record of one key (an aggregate's events), in offset order, from the key index."), form);
}

// -- a partition: offsets, segments, cleanup ---------------------------------------------------

async function viewPartition(target, [, name, partition]) {
  const base = `/v1/topics/${encodeURIComponent(name)}/partitions/${partition}`;
  const [topic, segments, maintenance] = await Promise.all([
    get(`/v1/topics/${encodeURIComponent(name)}`), can("read") ? get(`${base}/segments`) : null, get(`${base}/maintenance`)]);
  const offsets = topic.partitions.find((p) => p.partition === Number(partition));
  if (!offsets) throw new Error(`${name} has no partition ${partition}`);
  const facts = h("dl", { class: "facts" },
    h("dt", null, "Log start offset"), h("dd", null, fmtInt(offsets.log_start_offset)),
    h("dt", null, "High watermark"), h("dd", null, fmtInt(offsets.high_watermark)),
    h("dt", null, "Log end offset"), h("dd", null, fmtInt(offsets.log_end_offset)),
    h("dt", null, "Cleanup policy"), h("dd", null, maintenance.cleanup_policy),
    h("dt", null, "Owner shard"), h("dd", null, String(maintenance.owner_shard)),
    h("dt", null, "Compactor checkpoint"), h("dd", null, maintenance.cleaner_offset === null ? "never cleaned" : fmtInt(maintenance.cleaner_offset)),
    h("dt", null, "Dirty ratio"), h("dd", null, maintenance.dirty_ratio === null ? "–" : maintenance.dirty_ratio.toFixed(3)));
  const segmentRows = segments ? segments.segments.map((s) => h("tr", null,
    num(s.base_offset), num(s.last_offset), num(Math.max(0, s.last_offset - s.base_offset + 1)), h("td", { class: "num" }, fmtBytes(s.size_bytes)),
    timeCell(s.first_timestamp), timeCell(s.max_timestamp),
    num(s.index_entries), num(s.time_index_entries),
    h("td", null, s.active ? h("span", { class: "tag active" }, "active") : h("span", { class: "tag" }, "closed")))) : [];
  const out = h("div", { id: "maintenance-result" });
  const run = (what) => async () => {
    try {
      const answer = await api("POST", `/v1/admin/${what}/run`, { topic: name, partition: Number(partition) });
      sessionStorage.setItem("eventlog-last-run", JSON.stringify({ what, answer }));
      route();
    } catch (error) { result(out, error.text || String(error), false); }
  };
  const compact = maintenance.cleanup_policy.includes("compact");
  put(target, 
    h("div", { class: "crumbs" }, h("a", { href: "#/topics" }, "Topics"), " / ", h("a", { href: topicHref(name) }, name), " / "),
    h("h1", null, `${name} · partition ${partition}`),
    h("div", { class: "toolbar" },
      can("read") ? h("a", { href: `${topicHref(name)}/records?${q({ partition })}` }, h("button", { type: "button" }, "Browse records")) : null,
      can("read") ? h("a", { href: `${topicHref(name)}/tail?${q({ partition })}` }, h("button", { type: "button" }, "Live tail")) : null),
    h("div", { class: "grid" },
      h("section", { class: "panel" }, h("h2", null, "Offsets"), facts),
      h("section", { class: "panel", id: "passes" }, h("h2", null, "Cleanup passes (since the server started)"),
        passBlock("Retention", maintenance.last_retention),
        passBlock("Compaction", maintenance.last_compaction, compact ? null : "not a compacted topic"),
        can("admin") ? h("div", { class: "toolbar spaced" },
          h("button", { type: "button", id: "run-retention", onclick: run("retention") }, "Run retention now"),
          h("button", { type: "button", id: "run-compaction", disabled: !compact, onclick: run("compaction") }, "Run compaction now")) : null,
        out, lastRunNote())),
    h("section", { class: "panel" }, h("h2", null, "Segments"),
      segments ? table(["#Base offset", "#Last offset", "#Offsets", "#Size", "First timestamp", "Max timestamp", "#Index entries", "#Time index entries", "State"], segmentRows, { id: "segments" })
        : h("p", { class: "muted" }, "This token may not read the partition.")));
}

function lastRunNote() {
  const last = sessionStorage.getItem("eventlog-last-run");
  if (!last) return null;
  sessionStorage.removeItem("eventlog-last-run");
  const { what, answer } = JSON.parse(last);
  const text = what === "retention"
    ? `Retention pass: ${answer.segments_deleted} segment(s) deleted, ${fmtBytes(answer.bytes_reclaimed)} reclaimed.`
    : `Compaction pass: ${answer.records_removed} record(s) removed, ${fmtBytes(answer.bytes_reclaimed)} reclaimed.`;
  return h("div", { class: "result ok", id: "last-run" }, text);
}

function passBlock(title, pass, absent) {
  if (!pass) return h("p", null, h("b", null, `${title}: `), h("span", { class: "muted" }, absent || "no pass yet"));
  const r = pass.result || {};
  let what = pass.note || "";
  if (pass.outcome === "ok" && title === "Retention") {
    what = `${r.segments_deleted} segment(s) deleted, ${fmtBytes(r.bytes_reclaimed)} reclaimed, log start ${fmtInt(r.log_start_offset)}`;
  } else if (pass.outcome === "ok") {
    what = r.cleaned
      ? `offsets ${fmtInt(r.first_dirty_offset)}–${fmtInt(r.end_offset - 1)} cleaned: ${fmtInt(r.records_kept)} kept, ${fmtInt(r.records_removed)} removed, ${fmtBytes(r.bytes_reclaimed)} reclaimed`
      : "nothing to clean";
  }
  return h("p", null, h("b", null, `${title}: `), timeSpan(pass.at_ms), " ",
    h("span", { class: `tag ${pass.outcome === "ok" ? "active" : "error"}` }, pass.outcome), " ", what);
}

// -- records: by offset, by time, by key -------------------------------------------------------

async function viewRecords(target, [, name], params) {
  const topic = await get(`/v1/topics/${encodeURIComponent(name)}`);
  // every partition merged (GET /v1/topics/{t}/records) unless a partition's offsets are asked for
  const mode = params.get("mode") || (params.has("partition") || params.has("offset") ? "offset" : "browse");
  if (mode === "browse") { await viewBrowse(target, topic, params); return; }
  const partition = Number(params.get("partition") || 0);
  const size = Number(params.get("size") || 50);
  const as = params.get("as") || "auto";
  const here = (changes) => `${topicHref(name)}/records?${q({ mode, partition, size, as, ...Object.fromEntries(params), ...changes })}`;
  const tabs = recordTabs(name, mode, { partition, size, as });
  const form = h("form", { class: "toolbar", id: "records-form" },
    mode !== "key" ? h("label", null, "Partition", h("select", { name: "partition" },
      topic.partitions.map((p) => h("option", { value: String(p.partition), selected: p.partition === partition }, String(p.partition))))) : null,
    mode === "offset" ? h("label", null, "From offset", h("input", { name: "offset", type: "number", min: 0, value: params.get("offset") || "", placeholder: "log start", class: "narrow" })) : null,
    mode === "time" ? h("label", null, `From (${zoneName()})`, h("input", { name: "time", type: "datetime-local", step: 1, value: params.get("time") || "" })) : null,
    mode === "key" ? h("label", null, "Key", h("input", { name: "key", value: params.get("key") || "", required: true, placeholder: "order-17" })) : null,
    ...pageControls(size, as),
    h("button", { class: "primary", type: "submit" }, "Show"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = Object.fromEntries(new FormData(form));
    go(`${topicHref(name)}/records?${q({ mode, ...data })}`);
  });
  form.querySelector("select[name=as]").addEventListener("change", () => form.requestSubmit());
  const body = h("div", { id: "records-body" }, h("p", { class: "muted" }, "Loading…"));
  put(target, 
    h("div", { class: "crumbs" }, h("a", { href: "#/topics" }, "Topics"), " / ", h("a", { href: topicHref(name) }, name), " / "),
    h("h1", null, `${name} · records`), tabs, h("section", { class: "panel" }, form, body));
  try {
    if (mode === "key") await showKeyPage(name, params, size, as, body, here);
    else await showOffsetPage(name, partition, mode, params, size, as, body, here);
  } catch (error) {
    put(body, h("p", { class: "result error" }, error.text || String(error)));
  }
}

const RECORD_MODES = { browse: "All partitions", offset: "One partition, by offset", time: "One partition, by time", key: "By key" };

// the page size and value view of both records forms (one partition, and all merged)
function pageControls(size, as) {
  return [
    h("label", null, "Page", h("select", { name: "size" }, [20, 50, 100, 500].map((n) => h("option", { value: String(n), selected: n === size }, String(n))))),
    h("label", null, "Show values as", h("select", { name: "as" }, ["auto", "text", "json", "hex"].map((v) => h("option", { value: v, selected: v === as }, v)))),
  ];
}

function recordTabs(name, mode, keep) {
  return h("div", { class: "tabs" }, Object.entries(RECORD_MODES).map(([m, title]) =>
    h("a", { href: `${topicHref(name)}/records?${q({ mode: m, ...(m === "browse" ? {} : keep) })}`, class: m === mode ? "active" : "", dataset: { mode: m } }, title)));
}

// one line of a value: text, compact JSON, or hex for bytes that are not UTF-8
function preview(b64) {
  const bytes = bytesOf(b64);
  if (bytes === null) return h("span", { class: "tombstone" }, "null");
  const text = textOf(bytes);
  if (text === null) return h("span", { class: "muted" }, `hex ${Array.from(bytes.slice(0, 48), (b) => b.toString(16).padStart(2, "0")).join(" ")}`);
  let shown = text;
  const trimmed = text.trim();
  if (trimmed.startsWith("{") || trimmed.startsWith("[")) { try { shown = JSON.stringify(JSON.parse(text)); } catch { /* as typed */ } }
  return shown === "" ? h("span", { class: "muted" }, "(empty)") : shown.slice(0, 400);
}

// the records of every partition merged, newest or oldest first, filtered, a page at a time (the
// API pages with a cursor and looks at a bounded number of records a page: a filter that matches
// little answers short pages, said in the summary, and Next goes on)
async function viewBrowse(target, topic, params) {
  const name = topic.name;
  const p = (key, fallback = "") => params.get(key) ?? fallback;
  const size = Number(p("size", "50"));
  const as = p("as", "auto");
  const form = h("form", { class: "toolbar", id: "browse-form" },
    h("label", null, "Order", h("select", { name: "order" }, ["newest", "oldest"].map((o) => h("option", { value: o, selected: o === p("order", "newest") }, `${o} first`)))),
    h("label", null, "Partition", h("select", { name: "partition" }, h("option", { value: "" }, "all"),
      topic.partitions.map((x) => h("option", { value: String(x.partition), selected: String(x.partition) === p("partition") }, String(x.partition))))),
    h("label", null, "Key", h("input", { name: "key", value: p("key"), placeholder: "exactly", class: "medium" })),
    h("label", null, "Value contains", h("input", { name: "value_contains", value: p("value_contains"), placeholder: "text", class: "medium" })),
    h("label", null, "Header", h("input", { name: "header", value: p("header"), placeholder: "name or name=value", class: "medium" })),
    h("label", null, "From offset (each partition)", h("input", { name: "from_offset", type: "number", min: 0, value: p("from_offset"), class: "narrow" })),
    h("label", null, `From time (${zoneName()})`, h("input", { name: "from_time", type: "datetime-local", step: 1, value: p("from_time") })),
    ...pageControls(size, as),
    h("button", { class: "primary", type: "submit" }, "Show"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = Object.fromEntries(new FormData(form));
    if (data.from_offset !== "" && data.from_time !== "") data.from_time = ""; // one start: the offset
    go(`${topicHref(name)}/records?${q({ mode: "browse", ...data })}`);
  });
  const body = h("div", { id: "records-body" }, h("p", { class: "muted" }, "Loading…"));
  put(target,
    h("div", { class: "crumbs" }, h("a", { href: "#/topics" }, "Topics"), " / ", h("a", { href: topicHref(name) }, name), " / "),
    h("h1", null, `${name} · records`), recordTabs(name, "browse", { size, as }), h("section", { class: "panel" }, form, body));
  // the key as typed, sent in base64 as the page asks for keys (key_format=base64)
  const filters = { order: p("order", "newest"), partition: p("partition"), key: p("key") ? base64Of(p("key")) : "", value_contains: p("value_contains"), header: p("header") };
  const start = p("cursor") ? { cursor: p("cursor") }
    : { from_offset: p("from_offset"), from_time: p("from_time") ? picked(p("from_time")) : "" };
  let page;
  try {
    page = await get(`/v1/topics/${encodeURIComponent(name)}/records?${q({ ...filters, ...start, limit: size, key_format: "base64", value_format: "base64" })}`);
  } catch (error) { put(body, h("p", { class: "result error" }, error.text || String(error))); return; }
  const here = (changes) => `${topicHref(name)}/records?${q({ mode: "browse", ...Object.fromEntries(params), ...changes })}`;
  const back = p("back").split(",").filter(Boolean);
  const pager = h("div", { class: "pager" },
    h("a", { href: here({ cursor: "", back: "" }), id: "first" }, h("button", { type: "button", disabled: !p("cursor") }, "⇤ First")),
    h("a", { href: here({ cursor: back.length ? back[back.length - 1].replace("first", "") : "", back: back.slice(0, -1).join(",") }), id: "previous" },
      h("button", { type: "button", disabled: !p("cursor") }, "◀ Previous")),
    h("a", { href: here({ cursor: page.next_cursor || "", back: [...back, p("cursor") || "first"].join(",") }), id: "next" },
      h("button", { type: "button", disabled: !page.next_cursor }, "Next ▶")),
    h("span", { class: "muted", id: "browse-summary" }, `${page.records.length} record${page.records.length === 1 ? "" : "s"} · ${fmtInt(page.scanned)} looked at`,
      page.scan_limited ? ` · the page stopped after ${fmtInt(page.scanned)} records: Next ▶ looks further` : "",
      page.next_cursor ? "" : " · the end"));
  const rows = h("tbody");
  for (const r of page.records) {
    const line = h("tr", { class: "line", dataset: { partition: r.partition, offset: r.offset }, tabindex: 0, title: "show the whole record" },
      h("td", { class: "num" }, String(r.partition)), h("td", { class: "num mono" }, String(r.offset)), timeCell(r.timestamp),
      h("td", { class: "key clip" }, preview(r.key)), h("td", { class: "value clip" }, preview(r.value)),
      h("td", { class: "num" }, r.headers.length ? String(r.headers.length) : "–"));
    const toggle = () => {
      const open = line.nextElementSibling;
      if (open && open.classList.contains("detail")) { open.remove(); line.classList.remove("open"); return; }
      line.classList.add("open");
      line.after(h("tr", { class: "detail" }, h("td", { colspan: 6 },
        h("dl", { class: "facts" },
          h("dt", null, "Partition · offset"), h("dd", null, `${r.partition} · ${r.offset}`),
          h("dt", null, "Timestamp"), h("dd", { title: otherTime(r.timestamp) }, `${fmtTime(r.timestamp)} (${r.timestamp} ms)`),
          h("dt", null, "Key"), h("dd", { class: "key" }, renderBytes(r.key, as === "hex" ? "hex" : "auto")),
          h("dt", null, "Value"), h("dd", { class: "value" }, renderBytes(r.value, as)),
          h("dt", null, "Headers"), h("dd", { class: "headers mono" }, renderHeaders(r.headers, as))))));
    };
    line.addEventListener("click", toggle);
    line.addEventListener("keydown", (e) => { if (e.key === "Enter") toggle(); });
    rows.append(line);
  }
  if (!page.records.length) rows.append(h("tr", null, h("td", { colspan: 6, class: "muted", id: "no-records" }, "no records on this page")));
  put(body, pager, h("div", { class: "scroll" }, h("table", { id: "records", class: "lines" },
    h("colgroup", null, h("col", { class: "c-partition" }), h("col", { class: "c-offset" }), h("col", { class: "c-time" }), h("col", { class: "c-key" }), h("col"), h("col", { class: "c-headers" })),
    h("thead", null, h("tr", null, h("th", { class: "num" }, "Partition"), h("th", { class: "num" }, "Offset"), h("th", { title: `in ${zoneName()}` }, `Timestamp (${zone === "utc" ? "UTC" : "local"})`),
      h("th", null, "Key"), h("th", null, "Value"), h("th", { class: "num" }, "Headers"))), rows)));
}

async function showOffsetPage(name, partition, mode, params, size, as, body, here) {
  const base = `/v1/topics/${encodeURIComponent(name)}/partitions/${partition}`;
  let offset = params.get("offset");
  let note = null;
  if (mode === "time") {
    const time = params.get("time");
    if (!time) { put(body, h("p", { class: "muted" }, "Pick a date and time: the page starts at the first record at or after it.")); return; }
    const ms = picked(time);
    const found = await get(`${base}/offsets?${q({ timestamp: ms })}`);
    if (found.offset === null) {
      put(body, h("p", { class: "muted", id: "no-records" }, `No record at or after ${fmtTime(ms)} in partition ${partition}.`));
      return;
    }
    offset = found.offset;
    note = `First record at or after ${fmtTime(ms)}: offset ${found.offset} (${fmtTime(found.timestamp)}).`;
  }
  const offsets = await get(`${base}/offsets`);
  if (offset === null || offset === "" || offset === undefined) offset = offsets.log_start_offset;
  offset = Number(offset);
  if (offset < offsets.log_start_offset || offset > offsets.high_watermark) {
    put(body, h("p", { class: "result error" }, `Offset ${offset} is outside partition ${partition}: it holds ${offsets.log_start_offset} to ${offsets.high_watermark - 1}. `),
      h("a", { href: here({ mode: "offset", offset: offsets.log_start_offset }) }, "Go to the oldest record"));
    return;
  }
  const page = await get(`${base}/records?${q({ offset, max_records: size, key_format: "base64", value_format: "base64" })}`);
  // previous page: the records before this page's first offset (compaction leaves gaps)
  const previous = Math.max(offsets.log_start_offset, offset - size);
  const pager = h("div", { class: "pager" },
    h("a", { href: here({ mode: "offset", offset: offsets.log_start_offset }) }, h("button", { type: "button", disabled: offset <= offsets.log_start_offset }, "⇤ Oldest")),
    h("a", { href: here({ mode: "offset", offset: previous }), id: "previous" }, h("button", { type: "button", disabled: offset <= offsets.log_start_offset }, "◀ Previous")),
    h("a", { href: here({ mode: "offset", offset: page.next_offset }), id: "next" }, h("button", { type: "button", disabled: page.next_offset >= page.high_watermark }, "Next ▶")),
    h("a", { href: here({ mode: "offset", offset: Math.max(offsets.log_start_offset, page.high_watermark - size) }) }, h("button", { type: "button" }, "Newest ⇥")),
    h("span", { class: "muted" }, page.records.length
      ? `offsets ${page.records[0].offset}–${page.records[page.records.length - 1].offset} of ${page.log_start_offset}–${page.high_watermark - 1}`
      : `no records from offset ${offset} (high watermark ${page.high_watermark})`));
  put(body, note ? h("p", { class: "muted", id: "time-note" }, note) : null, pager,
    table(["#Offset", "Timestamp", "Key", "Value", "Headers"], recordRows(page.records, as), { id: "records" }));
}

async function showKeyPage(name, params, size, as, body, here) {
  const key = params.get("key");
  if (!key) { put(body, h("p", { class: "muted" }, "Type a key: its records come from its partition's key index, in offset order.")); return; }
  const from = params.get("offset");
  const page = await get(`/v1/topics/${encodeURIComponent(name)}/keys/${encodeURIComponent(key)}/records?${q({ offset: from, max_records: size, value_format: "base64", key_format: "string" })}`);
  // the API gave the key back as a string (key_format=string): show it as the others are
  const records = page.records.map((r) => ({ ...r, key: base64Of(r.key) }));
  // a key's pages only go forward (the key index is read from an offset on): the starts of the
  // pages before this one ride along in the link, so Previous goes back to them
  const back = (params.get("back") || "").split(",").filter(Boolean);
  const pager = h("div", { class: "pager" },
    h("a", { href: here({ offset: "", back: "" }) }, h("button", { type: "button", disabled: !from }, "⇤ First")),
    h("a", { href: here({ offset: back.length ? back[back.length - 1].replace("first", "") : "", back: back.slice(0, -1).join(",") }), id: "previous" },
      h("button", { type: "button", disabled: !from }, "◀ Previous")),
    h("a", { href: here({ offset: page.next_offset, back: [...back, from || "first"].join(",") }), id: "next" },
      h("button", { type: "button", disabled: !page.more }, "Next ▶")),
    h("span", { class: "muted", id: "key-summary" },
      `key ${JSON.stringify(key)} · partition ${page.partition} · latest offset ${page.latest_offset < 0 ? "none" : page.latest_offset} · ${records.length} record(s) on this page`));
  put(body, pager, table(["#Offset", "#Partition", "Timestamp", "Key", "Value", "Headers"], recordRows(records, as, page.partition), { id: "records" }));
}

// -- live tail over server-sent events ----------------------------------------------------------

async function viewTail(target, [, name], params) {
  const topic = await get(`/v1/topics/${encodeURIComponent(name)}`);
  const partition = Number(params.get("partition") || 0);
  const as = params.get("as") || "auto";
  const keep = 500;
  let next = params.get("offset") ? Number(params.get("offset")) : null; // null: from the end
  let controller = null;
  let received = 0;
  const seen = [[performance.now(), 0]]; // (time, records received) each second, the last 5 s
  const rows = h("tbody");
  const status = h("span", { id: "tail-status", class: "muted" }, "starting");
  const rate = h("span", { class: "rate", id: "tail-rate" }, "0");
  const count = h("span", { id: "tail-count" }, "0");
  const toggle = h("button", { type: "button", id: "tail-toggle", class: "primary" }, "Pause");

  async function run() {
    controller = new AbortController();
    toggle.textContent = "Pause";
    status.textContent = next === null ? "live: new records as they arrive" : `live from offset ${next}`;
    const path = `/v1/topics/${encodeURIComponent(name)}/partitions/${partition}/records/stream?${q({ offset: next, key_format: "base64", value_format: "base64" })}`;
    try {
      for await (const event of events(path, controller.signal)) {
        if (event.event === "record") {
          const record = JSON.parse(event.data);
          next = record.offset + 1;
          received++;
          rows.prepend(...recordRows([record], as));
          while (rows.children.length > keep) rows.lastElementChild.remove();
        } else if (event.event === "error" || event.event === "end") {
          status.textContent = `stream ended: ${event.data}`;
          controller = null;
          toggle.textContent = "Resume";
          return;
        }
      }
      status.textContent = "the server closed the stream";
    } catch (error) {
      if (error.name === "AbortError") return;
      status.textContent = error.text || String(error);
    }
    controller = null;
    toggle.textContent = "Resume";
  }

  toggle.addEventListener("click", () => {
    if (controller) {
      controller.abort();
      controller = null;
      toggle.textContent = "Resume";
      status.textContent = `paused at offset ${next === null ? "(end)" : next}`;
    } else run();
  });
  const timer = setInterval(() => {
    const now = performance.now();
    seen.push([now, received]);
    if (seen.length > 6) seen.shift();
    const [then, before] = seen[0];
    rate.textContent = ((received - before) / ((now - then) / 1000)).toFixed(1); // over the last 5 s
    count.textContent = fmtInt(received);
  }, 1000);
  onLeave(target, () => { clearInterval(timer); if (controller) controller.abort(); });

  const picker = h("select", { name: "partition", onchange: (e) => go(`${topicHref(name)}/tail?${q({ partition: e.target.value, as })}`) },
    topic.partitions.map((p) => h("option", { value: String(p.partition), selected: p.partition === partition }, String(p.partition))));
  put(target, 
    h("div", { class: "crumbs" }, h("a", { href: "#/topics" }, "Topics"), " / ", h("a", { href: topicHref(name) }, name), " / "),
    h("h1", null, `${name} · live tail`),
    h("section", { class: "panel" },
      h("div", { class: "toolbar" }, h("label", null, "Partition", picker), toggle,
        h("span", null, rate, " records/s (last 5 s) · ", count, " received · ", status)),
      h("p", { class: "muted" }, `Newest first; the last ${keep} are kept. Pause ends the stream; Resume goes on from the next offset.`),
      h("div", { class: "scroll" }, h("table", { id: "tail" },
        h("thead", null, h("tr", null, ["Offset", "Timestamp", "Key", "Value", "Headers"].map((c) => h("th", null, c)))), rows))));
  run();
}

// -- consumer groups -----------------------------------------------------------------------------

async function withLag(offsets) {
  const topics = [...new Set(offsets.map((o) => o.topic))];
  const marks = {};
  await Promise.all(topics.map(async (t) => {
    try {
      const topic = await get(`/v1/topics/${encodeURIComponent(t)}`);
      for (const p of topic.partitions) marks[`${t}/${p.partition}`] = p.high_watermark;
    } catch { /* a deleted topic, or one the token may not describe: no lag */ }
  }));
  return offsets.map((o) => {
    const hw = marks[`${o.topic}/${o.partition}`];
    return { ...o, high_watermark: hw, lag: hw === undefined ? null : Math.max(0, hw - o.offset) };
  });
}

// groups a page: each one's offsets (and its topics' high watermarks) are fetched to show its lag
const GROUPS_PAGE = 100;

async function viewGroups(target, _match, params) {
  const after = params.get("after") || null;
  const { groups, next_after: nextAfter } = await get(`/v1/groups?${q({ limit: GROUPS_PAGE, after })}`);
  const details = await Promise.all(groups.map(async (g) => ({ group: g, offsets: await withLag((await get(`/v1/groups/${encodeURIComponent(g)}/offsets`)).offsets) })));
  const rows = details.map(({ group, offsets }) => h("tr", { dataset: { group } },
    h("td", null, h("a", { href: `#/groups/${encodeURIComponent(group)}` }, group)),
    h("td", null, [...new Set(offsets.map((o) => o.topic))].join(", ")), num(offsets.length),
    timeCell(offsets.length ? Math.max(...offsets.map((o) => o.commit_timestamp)) : null),
    num(offsets.reduce((s, o) => s + (o.lag || 0), 0))));
  put(target, h("h1", null, "Consumer groups"),
    h("section", { class: "panel" },
      h("p", { class: "muted" }, "Groups with committed offsets (POST /v1/groups/{group}/offsets). Lag: high watermark − committed offset."),
      table(["Group", "Topics", "#Partitions", "Last commit", "#Total lag"], rows, { id: "groups" }),
      h("div", { class: "pager" },
        h("a", { href: "#/groups" }, h("button", { type: "button", disabled: !after }, "⇤ First")),
        h("a", { href: `#/groups?${q({ after: nextAfter })}`, id: "next-groups" }, h("button", { type: "button", disabled: !nextAfter }, "Next ▶")),
        h("span", { class: "muted" }, groups.length ? `${groups[0]} – ${groups[groups.length - 1]}, by name` : "no groups"))));
}

async function viewGroup(target, [, group]) {
  const { offsets } = await get(`/v1/groups/${encodeURIComponent(group)}/offsets`);
  const lagged = await withLag(offsets);
  const rows = lagged.map((o) => h("tr", null,
    h("td", null, h("a", { href: topicHref(o.topic) }, o.topic)), num(o.partition), num(o.offset), num(o.high_watermark), num(o.lag),
    timeCell(o.commit_timestamp), h("td", { class: "mono" }, o.metadata || "")));
  const remove = async () => {
    if (!(await confirmTyped(`Delete every committed offset of group ${group}?`, group))) return;
    try { await api("DELETE", `/v1/groups/${encodeURIComponent(group)}/offsets`); go("#/groups"); } catch (error) { showBanner(error.text || String(error)); }
  };
  put(target, 
    h("div", { class: "crumbs" }, h("a", { href: "#/groups" }, "Consumer groups"), " / "),
    h("h1", null, group),
    h("section", { class: "panel" },
      table(["Topic", "#Partition", "#Committed", "#High watermark", "#Lag", "Committed at", "Metadata"], rows, { id: "group-offsets" }),
      can("group") ? h("div", { class: "toolbar spaced" }, h("button", { class: "danger", type: "button", onclick: remove }, "Delete the group's offsets")) : null),
    can("group") ? resetOffsetsPanel(group, [...new Set(offsets.map((o) => o.topic))]) : null);
}

// Kafka's kafka-consumer-groups.sh --reset-offsets: Preview is its --dry-run, Reset its --execute;
// the server refuses a group with live Kafka members (group_not_empty), shown as the answer
const RESET_STRATEGIES = [["to_earliest", "to earliest"], ["to_latest", "to latest"], ["to_datetime", "to a time"],
  ["to_offset", "to an offset"], ["shift_by", "shift by ±N"]];

function resetOffsetsPanel(group, topics) {
  const out = h("div", { id: "reset-result" });
  const value = h("input", { name: "value", class: "narrow", disabled: true, "aria-label": "value" });
  const strategy = h("select", { name: "strategy" }, RESET_STRATEGIES.map(([v, label]) => h("option", { value: v }, label)));
  strategy.addEventListener("change", () => {
    const kind = strategy.value;
    value.disabled = kind === "to_earliest" || kind === "to_latest";
    value.type = kind === "to_datetime" ? "datetime-local" : "number";
    value.step = "1";
    value.min = kind === "to_offset" ? "0" : "";
    value.placeholder = kind === "shift_by" ? "-10" : "";
    value.title = kind === "to_datetime" ? `read in ${zoneName()}, the zone the console shows` : "";
  });
  const form = h("form", { class: "inline spaced", id: "reset-offsets" },
    h("label", null, "Topic", h("input", { name: "topic", list: "group-topics", placeholder: "every topic of the group", value: topics.length === 1 ? topics[0] : "" })),
    h("datalist", { id: "group-topics" }, topics.map((t) => h("option", { value: t }))),
    h("label", null, "Partitions", h("input", { name: "partitions", placeholder: "all, or 0,2", class: "narrow" })),
    h("label", null, "Reset", strategy), h("label", null, "Value", value),
    h("button", { type: "submit", name: "dry_run", value: "1" }, "Preview"),
    h("button", { type: "submit", name: "execute", value: "1", class: "danger" }, "Reset offsets"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const execute = event.submitter && event.submitter.name === "execute";
    const body = { dry_run: !execute };
    const topic = data.get("topic").trim();
    if (topic) body.topic = topic; else body.all_topics = true;
    const parts = data.get("partitions").trim();
    if (parts) body.partitions = parts.split(",").map((p) => Number(p.trim()));
    const kind = strategy.value;
    if (kind === "to_earliest" || kind === "to_latest") body[kind] = true;
    else if (kind === "to_datetime") body.to_datetime = value.value ? new Date(picked(value.value)).toISOString() : "";
    else body[kind] = Number(value.value);
    try {
      const answer = await api("POST", `/v1/groups/${encodeURIComponent(group)}/offsets/reset`, body);
      if (execute) { showBanner(`Reset ${answer.offsets.length} offset(s) of group ${group}.`, "info"); route(); return; }
      put(out, h("p", { class: "muted" }, "Preview: nothing was committed."),
        table(["Topic", "#Partition", "#Committed now", "#New offset"], answer.offsets.map((o) => h("tr", null,
          h("td", null, o.topic), num(o.partition), num(o.previous_offset), num(o.offset))), { id: "reset-plan" }));
    } catch (error) { result(out, error.text || String(error), false); }
  });
  return h("section", { class: "panel" }, h("h2", null, "Reset offsets"),
    h("p", { class: "muted" }, "As kafka-consumer-groups.sh --reset-offsets: refused while Kafka consumers are members of the group."),
    form, out);
}

// -- queues: records leased to workers, acknowledged one by one; dead letters sent back -----------

const queuePath = (topic, queue) => `/v1/topics/${encodeURIComponent(topic)}/queues/${encodeURIComponent(queue)}`;
const queueHref = (topic, queue) => `#/queues/${encodeURIComponent(topic)}/${encodeURIComponent(queue)}`;
// the headers a queue adds to a record it dead-letters (docs/API.md, Queues); a record sent
// back goes without them, as it was produced
const DEAD_HEADERS = ["eventlog.source.topic", "eventlog.source.partition", "eventlog.source.offset", "eventlog.delivery.count", "eventlog.dead.reason", "eventlog.source.queue"];
const sumOf = (partitions, field) => partitions.reduce((n, p) => n + p[field], 0);
// the queue's oldest unacknowledged record: the oldest of its partitions'
const oldestOf = (partitions) => partitions.reduce((n, p) => Math.max(n, p.oldest_unacked_age_ms), 0);

// an age (ms) as an operator reads it: "0 s" when nothing waits
function fmtAge(ms) {
  if (!ms) return "0 s";
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 3600000) return `${Math.floor(ms / 60000)} min ${Math.floor((ms % 60000) / 1000)} s`;
  if (ms < 86400000) return `${Math.floor(ms / 3600000)} h ${Math.floor((ms % 3600000) / 60000)} min`;
  return `${Math.floor(ms / 86400000)} d ${Math.floor((ms % 86400000) / 3600000)} h`;
}
const ageCell = (ms) => h("td", { class: "num", dataset: { ms }, title: `${fmtInt(ms)} ms` }, fmtAge(ms));
const startText = (start) => (typeof start === "string" ? start : `time ${fmtTime(start.timestamp)}`);

// Queues are named per topic (GET /v1/topics/{t}/queues): the list asks each topic the token
// sees, then describes each queue (one request per queue, as the topics list does per topic).
async function viewQueues(target) {
  const { topics } = await get("/v1/topics");
  const named = can("read") ? await Promise.all(topics.map((t) => get(`/v1/topics/${encodeURIComponent(t.name)}/queues`)
    .then((answer) => answer.queues.map((queue) => ({ topic: t.name, queue })), () => []))) : [];
  const queues = await Promise.all(named.flat().map(({ topic, queue }) =>
    get(queuePath(topic, queue)).catch((error) => ({ topic, queue, error }))));
  const rows = queues.map((d) => {
    if (d.error) return h("tr", null, h("td", null, d.queue), h("td", null, d.topic), h("td", { colspan: 5, class: "muted" }, d.error.text || String(d.error)));
    return h("tr", { dataset: { topic: d.topic, queue: d.queue } },
      h("td", null, h("a", { href: queueHref(d.topic, d.queue) }, d.queue)),
      h("td", null, h("a", { href: topicHref(d.topic) }, d.topic)), h("td", null, d.ordering),
      num(sumOf(d.partitions, "available")), num(sumOf(d.partitions, "leased")), num(sumOf(d.partitions, "dead_lettered")),
      ageCell(oldestOf(d.partitions)));
  });
  put(target,
    h("h1", null, "Queues", h("span", { class: "sub" }, `${queues.length} queue${queues.length === 1 ? "" : "s"}`)),
    can("read") ? createQueuePanel(topics.map((t) => t.name)) : h("section", { class: "panel" }, h("p", { class: "muted" }, "Queues are for tokens that may read (consume) a topic.")),
    h("section", { class: "panel" },
      h("p", { class: "muted" }, "Records leased to workers and acknowledged one by one; redelivered after their lock, dead-lettered after max deliveries or a reject."),
      table(["Name", "Topic", "Ordering", "#Available", "#Leased", "#Dead-lettered", "#Oldest unacked"], rows, { id: "queues" })));
}

function createQueuePanel(topics) {
  const out = h("div", { id: "create-queue-result" });
  const when = h("input", { name: "start_time", type: "datetime-local", step: 1, disabled: true, title: `read in ${zoneName()}, the zone the console shows`, "aria-label": "start time" });
  const start = h("select", { name: "start" }, ["earliest", "latest", "time"].map((s) => h("option", { value: s }, s)));
  start.addEventListener("change", () => { when.disabled = start.value !== "time"; when.required = start.value === "time"; });
  const form = h("form", { class: "inline", id: "create-queue" },
    h("label", null, "Topic", h("input", { name: "topic", list: "queue-topics", required: true, placeholder: "jobs" })),
    h("datalist", { id: "queue-topics" }, topics.map((t) => h("option", { value: t }))),
    h("label", null, "Name", h("input", { name: "queue", required: true, placeholder: "work" })),
    h("label", null, "Lock (ms)", h("input", { name: "lock_ms", type: "number", min: 1, value: "30000", class: "medium" })),
    h("label", null, "Max deliveries", h("input", { name: "max_deliveries", type: "number", min: 1, value: "5", class: "narrow" })),
    h("label", null, "Ordering", h("select", { name: "ordering" }, h("option", { value: "none" }, "none"), h("option", { value: "key" }, "key"))),
    h("label", null, "Start", start), h("label", null, `At (${zoneName()})`, when),
    h("label", null, "Dead-letter topic (blank: archived)", h("input", { name: "dead_letter_topic", list: "queue-topics", placeholder: "jobs.dead" })),
    h("button", { class: "primary", type: "submit" }, "Create queue"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const topic = data.get("topic").trim(), queue = data.get("queue").trim();
    const body = {
      lock_ms: Number(data.get("lock_ms")), max_deliveries: Number(data.get("max_deliveries")), ordering: data.get("ordering"),
      start: start.value === "time" ? { timestamp: picked(when.value) } : start.value,
      dead_letter_topic: data.get("dead_letter_topic").trim() || null,
    };
    try {
      await api("PUT", queuePath(topic, queue), body);
      go(queueHref(topic, queue));
    } catch (error) { result(out, error.text || String(error), false); }
  });
  return h("section", { class: "panel" }, h("h2", null, "Create a queue"), form, out);
}

function queueWindow(queue) {
  const rows = queue.partitions.map((p) => h("tr", { dataset: { partition: p.partition } },
    num(p.partition), num(p.start_offset), num(p.end_offset), num(p.available), num(p.leased), num(p.acked),
    num(p.dead_lettered), num(p.lag), num(p.redeliveries), num(p.lost_to_retention), ageCell(p.oldest_unacked_age_ms)));
  return table(["#Partition", "#First unacked", "#High watermark", "#Available", "#Leased", "#Acked", "#Dead-lettered", "#Lag",
    "#Redeliveries", "#Lost to retention", "#Oldest unacked"], rows, { id: "queue-partitions" });
}

async function viewQueue(target, [, topic, name]) {
  const queue = await get(queuePath(topic, name));
  const windowBox = h("div", null, queueWindow(queue));
  const deadBox = h("div", { id: "dead-letters-box" });
  const out = h("div", { id: "queue-result" });
  // after each action the window is asked for again: the counts the API has now
  async function refresh() {
    try { put(windowBox, queueWindow(await get(queuePath(topic, name)))); } catch (error) { result(out, error.text || String(error), false); }
  }
  const facts = h("dl", { class: "facts", id: "queue-settings" },
    h("dt", null, "Topic"), h("dd", null, h("a", { href: topicHref(topic) }, topic)),
    h("dt", null, "Lock"), h("dd", null, fmtMs(queue.lock_ms)),
    h("dt", null, "Max deliveries"), h("dd", null, String(queue.max_deliveries)),
    h("dt", null, "Ordering"), h("dd", null, queue.ordering),
    h("dt", null, "Start"), h("dd", null, startText(queue.start)),
    h("dt", null, "Dead-letter topic"), h("dd", null, queue.dead_letter_topic ? h("a", { href: topicHref(queue.dead_letter_topic) }, queue.dead_letter_topic) : "none (archived)"),
    h("dt", null, "Created"), h("dd", null, timeSpan(queue.created_ms)));
  put(target,
    h("div", { class: "crumbs" }, h("a", { href: "#/queues" }, "Queues"), " / ", h("a", { href: topicHref(topic) }, topic), " / "),
    h("h1", null, name, h("span", { class: "sub" }, `queue of ${topic}`)),
    h("div", { class: "toolbar" },
      h("button", { type: "button", id: "queue-refresh", onclick: refresh }, "Refresh"),
      h("button", { class: "danger", type: "button", id: "delete-queue", onclick: () => deleteQueue(topic, name) }, "Delete queue")),
    out,
    h("div", { class: "grid" },
      h("section", { class: "panel" }, h("h2", null, "Settings"), facts),
      h("section", { class: "panel wide-panel" }, h("h2", null, "Partitions"),
        h("p", { class: "muted" }, "The window of each partition: from its first record not yet acknowledged or dead-lettered to the high watermark."),
        windowBox),
      h("section", { class: "panel wide-panel" }, h("h2", null, "Dead letters"), deadBox)));
  // a token may read the queue's topic and not its dead-letter topic: said in that panel alone
  if (queue.dead_letter_topic) await deadLetters(deadBox, queue, out, refresh).catch((error) => result(deadBox, error.text || String(error), false));
  else put(deadBox, h("p", { class: "muted" }, "This queue has no dead-letter topic: records that fail are archived (counted, not kept)."));
}

const headerText = (headers, name) => {
  const found = (headers || []).find((x) => x.key === name);
  return found ? textOf(bytesOf(found.value)) : null;
};

// The dead-letter topic's records from this queue's topic (the browse API's header filter),
// oldest first, read as bytes (base64) so a record sent back is the one written, byte for byte.
async function deadLetters(box, queue, out, refresh) {
  const dead = queue.dead_letter_topic;
  const page = await get(`/v1/topics/${encodeURIComponent(dead)}/records?${q({
    order: "oldest", limit: 200, header: `eventlog.source.topic=${queue.topic}`, key_format: "base64", value_format: "base64" })}`);
  const mayWrite = can("write");
  // another queue of the topic may share the dead-letter topic: its records name it (records
  // dead-lettered before the header existed name none, and are shown)
  const ours = page.records.filter((r) => [null, queue.queue].includes(headerText(r.headers, "eventlog.source.queue")));
  const rows = ours.map((r) => {
    const source = { topic: headerText(r.headers, "eventlog.source.topic"), partition: headerText(r.headers, "eventlog.source.partition"), offset: headerText(r.headers, "eventlog.source.offset") };
    const kept = (r.headers || []).filter((x) => !DEAD_HEADERS.includes(x.key));
    const cell = h("td");
    if (mayWrite) {
      const send = h("button", { type: "button", class: "send-back" }, "Send back");
      send.addEventListener("click", async () => {
        send.disabled = true;
        const record = { key: r.key, value: r.value, headers: kept, partition: Number(source.partition) };
        try {
          const answer = await api("POST", `/v1/topics/${encodeURIComponent(source.topic)}/records`, { records: [record], key_format: "base64", value_format: "base64" });
          const o = answer.offsets[0];
          put(cell, h("span", { class: "result ok sent" }, `sent back: ${source.topic} partition ${o.partition}, offset ${o.offset}`));
          result(out, `Sent ${dead} ${r.partition}:${r.offset} back to ${source.topic}: partition ${o.partition}, offset ${o.offset}.`);
          await refresh();
        } catch (error) { send.disabled = false; result(out, error.text || String(error), false); }
      });
      cell.append(send);
    }
    return h("tr", { dataset: { partition: r.partition, offset: r.offset } },
      h("td", { class: "num mono" }, `${r.partition}:${r.offset}`), timeCell(r.timestamp),
      h("td", { class: "mono source" }, `${source.topic} ${source.partition}:${source.offset}`),
      h("td", { class: "num deliveries" }, headerText(r.headers, "eventlog.delivery.count") || "–"),
      h("td", { class: "reason" }, h("span", { class: "tag error" }, headerText(r.headers, "eventlog.dead.reason") || "–")),
      h("td", { class: "key" }, renderBytes(r.key, "auto")), h("td", { class: "value" }, renderBytes(r.value, "auto")),
      h("td", { class: "headers mono" }, renderHeaders(kept, "auto")), cell);
  });
  put(box,
    h("p", { class: "muted" }, "Records of ", h("a", { href: topicHref(dead) }, dead), ` from ${queue.topic} (oldest first, the first 200). `,
      mayWrite ? "Send back produces the record (key, value, headers without the dead-letter ones) to its source partition, where the queue leases it again." : "Sending one back needs a token that may write."),
    table(["#Dead letter", "Timestamp", "Source", "#Deliveries", "Reason", "Key", "Value", "Headers", ""], rows, { id: "dead-letters" }));
}

async function deleteQueue(topic, name) {
  if (!(await confirmTyped(`Delete queue ${name} of ${topic}? Its leases end; the topic's records stay.`, name))) return;
  try {
    await api("DELETE", queuePath(topic, name));
    showBanner(`Queue ${name} deleted.`, "info");
    go("#/queues");
  } catch (error) { showBanner(error.text || String(error)); }
}

// -- snapshots -----------------------------------------------------------------------------------

async function viewSnapshots(target) {
  if (!can("admin")) {
    put(target, h("h1", null, "Snapshots"), h("section", { class: "panel" }, h("p", { class: "muted" }, "Snapshots are for admin tokens.")));
    return;
  }
  const { snapshots } = await get("/v1/snapshots");
  const rows = snapshots.map((s) => h("tr", { dataset: { snapshot: s.id } },
    h("td", { class: "mono" }, s.id), timeCell(Date.parse(s.created_at)), h("td", null, s.topics.join(", ")),
    num(s.partitions.length), num(s.partitions.reduce((n, p) => n + p.high_watermark - p.log_start_offset, 0)),
    h("td", { class: "num" }, fmtBytes(s.partitions.reduce((n, p) => n + p.size_bytes, 0))), h("td", { class: "mono" }, s.path),
    h("td", null, h("button", { class: "danger", type: "button", onclick: () => removeSnapshot(s.id) }, "Delete"))));
  const out = h("div");
  const form = h("form", { class: "inline", id: "create-snapshot" },
    h("label", null, "Topics (comma-separated; blank: every user topic)", h("input", { name: "topics", class: "wide" })),
    h("button", { class: "primary", type: "submit" }, "Take a snapshot"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const names = new FormData(form).get("topics").split(",").map((t) => t.trim()).filter(Boolean);
    try {
      await api("POST", "/v1/snapshots", names.length ? { topics: names } : {});
      route();
    } catch (error) { result(out, error.text || String(error), false); }
  });
  put(target, h("h1", null, "Snapshots"),
    h("section", { class: "panel" }, h("p", { class: "muted" }, "A snapshot is a consistent copy of the topics' closed segments (hard links), read by Spark (docs/ANALYTICS.md)."), form, out),
    h("section", { class: "panel" }, table(["Id", "Created", "Topics", "#Partitions", "#Offsets", "#Size", "Path", ""], rows, { id: "snapshots" })));
}

async function removeSnapshot(id) {
  if (!(await confirmTyped(`Delete snapshot ${id}?`, id))) return;
  try { await api("DELETE", `/v1/snapshots/${encodeURIComponent(id)}`); route(); } catch (error) { showBanner(error.text || String(error)); }
}

// -- charts from /metrics --------------------------------------------------------------------------

const SERIES = [
  ["Produced records/s", "eventlog_produce_records_total"],
  ["Produced bytes/s", "eventlog_produce_bytes_total", true],
  ["Fetched records/s", "eventlog_fetch_records_total"],
  ["Fetched bytes/s", "eventlog_fetch_bytes_total", true],
];
const history = { samples: [] }; // kept across visits to the charts, for this tab

function sums(text) {
  const totals = {}, byTopic = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const brace = line.indexOf("{");
    const space = line.lastIndexOf(" ");
    const name = brace >= 0 ? line.slice(0, brace) : line.slice(0, space);
    if (!SERIES.some(([, metric]) => metric === name)) continue;
    const value = Number(line.slice(space + 1));
    totals[name] = (totals[name] || 0) + value;
    const topic = /topic="([^"]*)"/.exec(line);
    if (topic) byTopic[`${name}|${topic[1]}`] = (byTopic[`${name}|${topic[1]}`] || 0) + value;
  }
  return { at: performance.now(), totals, byTopic };
}

function chart(title, rates, isBytes, span) {
  const values = rates.length === 1 ? [rates[0], rates[0]] : rates; // one rate: a level line
  const width = 600, height = 140, max = Math.max(1, ...values);
  const points = values.map((v, i) => `${(i / Math.max(1, values.length - 1)) * width},${height - (v / max) * (height - 12)}`).join(" ");
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", title);
  const el = (tag, attrs) => {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    svg.append(node);
    return node;
  };
  el("line", { x1: 0, y1: 12, x2: width, y2: 12 });
  el("line", { x1: 0, y1: height - 0.5, x2: width, y2: height - 0.5 });
  if (values.length > 1) {
    el("polygon", { class: "area", points: `0,${height} ${points} ${width},${height}` });
    el("polyline", { points });
  }
  const now = values.length ? values[values.length - 1] : 0;
  // labels in HTML, not in the SVG (stretched to the panel's width, its text would be too)
  const ago = (seconds) => (seconds >= 60 ? `−${(seconds / 60).toFixed(seconds % 60 ? 1 : 0)} min` : `−${Math.round(seconds)} s`);
  return h("section", { class: "panel chart", dataset: { series: title } },
    h("h2", null, title), h("div", { class: "now" }, isBytes ? `${fmtBytes(now)}/s` : now.toFixed(1)),
    h("div", { class: "max muted" }, `max ${isBytes ? `${fmtBytes(max)}/s` : max.toFixed(1)}`), svg,
    h("div", { class: "axis muted" }, h("span", null, span > 0 ? ago(span) : ""), h("span", null, span > 0 ? ago(span / 2) : ""), h("span", null, "now")));
}

async function viewCharts(target) {
  const grid = h("div", { class: "grid", id: "charts" });
  const topics = h("div");
  const info = h("dl", { class: "facts" });
  put(target, h("h1", null, "Charts", h("span", { class: "sub" }, "rates from /metrics, every 2 s, the last 3 minutes (this tab)")),
    h("section", { class: "panel" }, h("h2", null, "Server"), info), grid, h("section", { class: "panel" }, h("h2", null, "By topic (now)"), topics));
  const ready = await api("GET", "/readyz", undefined, { raw: true });
  put(info, 
    h("dt", null, "Version"), h("dd", null, me.server.version),
    h("dt", null, "Shard processes"), h("dd", null, String(me.server.shards)),
    h("dt", null, "Ready"), h("dd", null, ready.ok ? "yes" : `no (${ready.status})`),
    h("dt", null, "Auth"), h("dd", null, me.server.auth ? `on: ${me.name} (${me.role})` : "off (every request acts as admin)"));
  async function tick() {
    let sample;
    try { sample = sums(await get("/metrics")); } catch (error) { showBanner(error.text || String(error)); return; }
    history.samples.push(sample);
    if (history.samples.length > 91) history.samples.shift();
    const s = history.samples;
    const rates = (metric) => s.slice(1).map((b, i) => Math.max(0, ((b.totals[metric] || 0) - (s[i].totals[metric] || 0)) / ((b.at - s[i].at) / 1000)));
    const span = s.length > 1 ? (s[s.length - 1].at - s[0].at) / 1000 : 0; // seconds the charts cover
    put(grid, ...SERIES.map(([title, metric, isBytes]) => chart(title, rates(metric), isBytes, span)));
    if (s.length > 1) {
      const [a, b] = s.slice(-2);
      const seconds = (b.at - a.at) / 1000;
      // /metrics keeps a deleted topic's counters: only the topics there are now are listed
      let live = null;
      try { live = new Set((await get("/v1/topics")).topics.map((t) => t.name)); } catch { /* as they are */ }
      const names = [...new Set(Object.keys(b.byTopic).map((k) => k.split("|")[1]))].filter((t) => !live || live.has(t)).sort();
      const rate = (metric, t) => Math.max(0, ((b.byTopic[`${metric}|${t}`] || 0) - (a.byTopic[`${metric}|${t}`] || 0)) / seconds);
      put(topics, table(["Topic", "#Produced records/s", "#Produced bytes/s", "#Fetched records/s", "#Fetched bytes/s"],
        names.map((t) => h("tr", null, h("td", null, h("a", { href: topicHref(t) }, t)),
          h("td", { class: "num" }, rate(SERIES[0][1], t).toFixed(1)), h("td", { class: "num" }, `${fmtBytes(rate(SERIES[1][1], t))}/s`),
          h("td", { class: "num" }, rate(SERIES[2][1], t).toFixed(1)), h("td", { class: "num" }, `${fmtBytes(rate(SERIES[3][1], t))}/s`))), { id: "topic-rates" }));
    }
  }
  await tick();
  const timer = setInterval(tick, 2000);
  onLeave(target, () => clearInterval(timer));
}

// -- the router, the token -----------------------------------------------------------------------

const ROUTES = [
  [/^\/topics$/, viewTopics, "topics"],
  [/^\/topics\/([^/]+)$/, viewTopic, "topics"],
  [/^\/topics\/([^/]+)\/partitions\/(\d+)$/, viewPartition, "topics"],
  [/^\/topics\/([^/]+)\/records$/, viewRecords, "topics"],
  [/^\/topics\/([^/]+)\/tail$/, viewTail, "topics"],
  [/^\/groups$/, viewGroups, "groups"],
  [/^\/groups\/([^/]+)$/, viewGroup, "groups"],
  [/^\/queues$/, viewQueues, "queues"],
  [/^\/queues\/([^/]+)\/([^/]+)$/, viewQueue, "queues"],
  [/^\/snapshots$/, viewSnapshots, "snapshots"],
  [/^\/charts$/, viewCharts, "charts"],
];

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

async function route() {
  for (const stop of cleanups) stop();
  cleanups = [];
  const target = h("div");
  main.replaceChildren(target);
  const [path, query] = (location.hash.slice(1) || "/topics").split("?");
  const params = new URLSearchParams(query || "");
  const found = ROUTES.find(([pattern]) => pattern.test(path));
  for (const link of document.querySelectorAll("nav a")) link.classList.toggle("active", !!found && link.dataset.nav === found[2]);
  if (!found) { put(target, h("h1", null, "Not found"), h("p", null, h("a", { href: "#/topics" }, "Topics"))); return; }
  if (!me) { put(target, h("p", { class: "muted" }, "Enter a token above to see this server.")); return; }
  const match = found[0].exec(path).map((part, i) => (i ? decodeURIComponent(part) : part));
  document.title = `${path.split("/").filter(Boolean).map(decodeURIComponent).join(" · ")} – eventlog console`;
  put(target, h("p", { class: "muted" }, "Loading…"));
  try {
    await found[1](target, match, params);
    if (!target.isConnected) return;
    if (banner.dataset.keep) banner.dataset.keep = ""; else showBanner("");
  } catch (error) {
    if (!target.isConnected) return;
    if (error.status === 401) { await identify(); return; }
    put(target, h("h1", null, "Could not load this view"), h("p", { class: "result error" }, error.text || String(error)));
  }
}

async function identify() {
  const identity = document.getElementById("identity");
  try {
    me = await get("/v1/whoami");
    identity.textContent = me.server.auth ? `${me.name} · ${me.role}` : "no auth · admin";
    tokenControls(me.server.auth);
    document.getElementById("server-info").textContent = `eventlog ${me.server.version} · ${me.server.shards} shard process${me.server.shards === 1 ? "" : "es"}`;
    showBanner("");
  } catch (error) {
    me = null;
    identity.textContent = "no token";
    tokenControls(true);
    if (error.status === 401) showBanner(sessionStorage.getItem(TOKEN_KEY) ? "The server refused this token (401). Enter another one above." : "This server needs a token: enter it above (it is kept for this tab only).");
    else showBanner(error.text || String(error));
  }
}

// The token field and its buttons: shown when the server has an auth file (or whoami failed),
// hidden when it has none (every request acts as admin: there is no token to give).
function tokenControls(shown) {
  for (const e of document.querySelectorAll("#token-form input, #token-form button")) e.hidden = !shown;
}

document.getElementById("token").value = sessionStorage.getItem(TOKEN_KEY) || "";
document.getElementById("token-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const token = document.getElementById("token").value.trim();
  if (token) sessionStorage.setItem(TOKEN_KEY, token); else sessionStorage.removeItem(TOKEN_KEY);
  await identify();
  route();
});
document.getElementById("token-clear").addEventListener("click", async () => {
  sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("token").value = "";
  await identify();
  route();
});
for (const button of document.querySelectorAll("#zone-switch button")) button.addEventListener("click", () => setZone(button.dataset.zone));
showZone();
window.addEventListener("hashchange", route);
await identify();
route();

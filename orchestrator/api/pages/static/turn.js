// One turn, live: its events over GET /v1/turns/{id}/events (an EventSource, which resumes on its own with
// Last-Event-ID after a drop). The stream replays from the turn's first event, so a page opened late, or after
// the turn ended, shows all of it. Every value from an event goes in as text (textContent, append of a
// string), never as HTML: a tool's result or a model's answer may hold markup.
"use strict";

const TERMINAL = new Set(["completed", "stopped", "failed", "cancelled"]);
const LOG_LIMIT = 500;
const turnId = document.body.dataset.turnId;
const flowerUrl = document.body.dataset.flowerUrl || "";
const csrfToken = document.body.dataset.csrfToken || "";
const canApprove = document.body.dataset.canApprove === "true";
const base = "/v1/turns/" + encodeURIComponent(turnId);
const byId = (id) => document.getElementById(id);

const llmCalls = new Map(); // llm call index -> its block
const toolCalls = new Map(); // call id -> its card
let currentCall = null; // the model call in flight, or the last one
let queuedAt = null; // when the turn was submitted (its turn_queued event), epoch seconds
let finished = false;
let sawText = false;
let eventCount = 0;
let source = null;

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function setStatus(status, label) {
  const node = byId("turn-status");
  node.dataset.status = status;
  node.textContent = label || status;
}

function formatMs(ms) {
  if (ms === null || ms === undefined) return "";
  return ms < 1000 ? Math.round(ms) + " ms" : (ms / 1000).toFixed(2) + " s";
}

// --- model calls ------------------------------------------------------------------------------------------

function llmCall(index) {
  const key = Number(index);
  let block = llmCalls.get(key);
  if (block) return block;
  const root = element("div", "llm-call");
  root.dataset.llmCall = String(key);
  const head = element("div", "head muted", "model call " + (key + 1) + " ");
  const state = element("span", "state");
  head.append(state);
  const thinkingBox = element("details", "thinking-box");
  thinkingBox.open = true;
  thinkingBox.hidden = true;
  thinkingBox.append(element("summary", "muted", "thinking"));
  const thinking = element("div", "thinking");
  thinkingBox.append(thinking);
  const text = element("div", "text");
  const tools = element("div", "tools");
  root.append(head, thinkingBox, text, tools);
  block = { root, state, thinkingBox, thinking, text, tools };
  // In index order, whatever order the blocks are made in.
  const after = [...llmCalls.keys()].filter((k) => k > key).sort((a, b) => a - b)[0];
  byId("transcript").insertBefore(root, after === undefined ? null : llmCalls.get(after).root);
  llmCalls.set(key, block);
  return block;
}

function onModelCalled(data) {
  currentCall = data.llm_call_index;
  llmCall(currentCall).state.textContent = data.purpose === "compaction" ? "summarising the history…" : "writing…";
}

function onModelResponded(data) {
  const usage = data.usage || {};
  const tokens = usage.total_tokens ? ", " + usage.total_tokens + " tokens" : "";
  const kind = data.type === "tool_calls" ? "asked for " + data.tool_calls + " tool call(s)" : "answered";
  llmCall(data.llm_call_index).state.textContent = kind + " in " + formatMs(data.duration_ms) + tokens;
}

function onModelFailed(data) {
  if (currentCall === null) return;
  const retry = data.retry_in_s !== null && data.retry_in_s !== undefined ? ", retrying in " + data.retry_in_s + " s" : "";
  llmCall(currentCall).state.textContent = "failed: " + (data.message || data.error_type || "error") + retry;
}

function onEmptyAnswer() {
  if (currentCall !== null) llmCall(currentCall).state.textContent = "empty answer, asking again";
}

function onTextDelta(data) {
  llmCall(data.llm_call).text.append(data.text);
  sawText = true;
}

function onThinkingDelta(data) {
  const block = llmCall(data.llm_call);
  block.thinkingBox.hidden = false;
  block.thinking.append(data.text);
}

function onStreamReset(data) {
  // The call is retried (or its text came out reshaped): what was shown for it goes.
  const block = llmCall(data.llm_call);
  block.text.textContent = "";
  block.thinking.textContent = "";
  block.thinkingBox.hidden = true;
  block.state.textContent = "restarted…";
  for (const [callId, card] of toolCalls) {
    if (card.llmCall === Number(data.llm_call) && card.root.dataset.status === "announced") {
      card.root.remove();
      toolCalls.delete(callId);
    }
  }
}

// --- tool calls -------------------------------------------------------------------------------------------

function toolCard(callId, tool, llmIndex) {
  let card = toolCalls.get(callId);
  if (card) return card;
  const index = llmIndex !== undefined && llmIndex !== null ? Number(llmIndex) : currentCall === null ? 0 : currentCall;
  const root = element("div", "tool");
  root.dataset.callId = callId;
  const head = element("div", "head");
  const fields = {};
  head.append(element("strong", "name", tool));
  for (const name of ["status", "attempt", "worker", "duration", "outcome"]) {
    fields[name] = element("span", name === "status" || name === "outcome" ? name + " status" : name + " muted");
    head.append(fields[name]);
  }
  const flower = element("a", "flower");
  flower.hidden = true;
  head.append(flower);
  const progressBox = element("div", "progress");
  progressBox.hidden = true;
  const bar = element("progress");
  bar.max = 1;
  const progressText = element("span", "muted");
  progressBox.append(bar, " ", progressText);
  const argsBox = element("details", "arguments");
  argsBox.hidden = true;
  argsBox.append(element("summary", null, "arguments"));
  const args = element("pre");
  argsBox.append(args);
  // Why a failed call failed: the first line of its error (the whole of it is the model's to read).
  const errorLine = element("div", "error");
  errorLine.hidden = true;
  root.append(head, errorLine, progressBox, argsBox);
  llmCall(index).tools.append(root);
  card = { root, fields, flower, progressBox, bar, progressText, argsBox, args, errorLine, llmCall: index };
  toolCalls.set(callId, card);
  return card;
}

function setPhase(card, phase, label) {
  card.root.dataset.status = phase;
  card.fields.status.dataset.status = phase;
  card.fields.status.textContent = label || phase;
}

function onToolCallStarted(data) {
  if (!data.call_id) return;
  setPhase(toolCard(data.call_id, data.tool, data.llm_call), "announced", "being written by the model");
}

function onToolDispatched(data) {
  const card = toolCard(data.call_id, data.tool);
  setPhase(card, "dispatched", "queued");
  card.fields.attempt.textContent = "attempt " + data.attempt;
  card.argsBox.hidden = false;
  card.args.textContent = JSON.stringify(data.arguments ?? {}, null, 2);
  if (flowerUrl && data.task_id) {
    // Task ids hold colons, which a path keeps as they are (Flower's links spell them so).
    card.flower.href = flowerUrl + "/task/" + encodeURIComponent(data.task_id).replace(/%3A/gi, ":");
    card.flower.textContent = "task in Flower";
    card.flower.rel = "noreferrer";
    card.flower.target = "_blank";
    card.flower.hidden = false;
  }
}

function onToolStarted(data) {
  const card = toolCard(data.call_id, data.tool);
  setPhase(card, "running");
  card.fields.attempt.textContent = "attempt " + data.attempt;
  card.fields.worker.textContent = data.worker ? "on " + data.worker : "";
}

function onToolProgress(data) {
  const card = toolCard(data.call_id, data.tool);
  card.progressBox.hidden = false;
  const fraction = typeof data.fraction === "number" ? Math.min(1, Math.max(0, data.fraction)) : null;
  if (fraction === null) {
    card.bar.removeAttribute("value"); // indeterminate: the tool did not say how far it is
  } else {
    card.bar.value = fraction;
  }
  const percent = fraction === null ? "" : Math.round(fraction * 100) + "% ";
  card.progressText.textContent = percent + (data.message || "");
}

function onToolEnded(data, synthesized) {
  const card = toolCard(data.call_id, data.tool);
  setPhase(card, "finished", synthesized ? "finished (synthesized)" : "finished");
  const kind = data.ok ? "ok" : data.failure_kind || "error";
  card.root.dataset.outcome = kind;
  card.fields.outcome.dataset.status = data.ok ? "ok" : "error";
  card.fields.outcome.textContent = kind;
  card.errorLine.textContent = data.ok ? "" : data.error || "";
  card.errorLine.hidden = !card.errorLine.textContent;
  if (data.attempts) card.fields.attempt.textContent = "attempts " + data.attempts;
  if (data.worker) card.fields.worker.textContent = "on " + data.worker;
  card.fields.duration.textContent = formatMs(data.duration_ms);
}

function onToolRedispatched(data) {
  const card = toolCard(data.call_id, data.tool);
  setPhase(card, "dispatched", "sent again (" + data.reason + ")");
  card.fields.attempt.textContent = "attempt " + data.attempt;
}

function onApprovalRequested(data) {
  for (const callId of data.call_ids || []) setPhase(toolCard(callId, "?"), "waiting", "waiting for approval");
  refreshApprovals();
}

// --- timeline -------------------------------------------------------------------------------------------
// The model calls and tool calls as bars on one time axis (from the turn's first event), the waits shaded
// on their call's row: a call in its queue or waiting for a worker or a slot, a call waiting for approval.
// Drawn as SVG from the events (every text as a text node), redrawn at most once a frame.

const SVG_NS = "http://www.w3.org/2000/svg";
const TL_WIDTH = 960;
const TL_LABEL = 170;
const TL_ROW = 20;
const TL_AXIS = 22;
const timeline = { start: null, end: null, lastAt: null, rows: new Map(), openModel: null };
let timelineQueued = false;

function timelineRow(key, kind, label) {
  let row = timeline.rows.get(key);
  if (!row) {
    row = { key, kind, label, start: null, end: null, waits: [] };
    timeline.rows.set(key, row);
  }
  if (label && (!row.label || row.label === "?")) row.label = label;
  return row;
}

function openWait(row, at, why) {
  if (row.start === null) row.start = at;
  if (!row.waits.some((wait) => wait.end === null)) row.waits.push({ start: at, end: null, why });
}

function closeWaits(row, at) {
  for (const wait of row.waits) if (wait.end === null) wait.end = at;
}

function toolRow(data) {
  return timelineRow("tool:" + data.call_id, "tool", data.tool ? data.tool + " " + data.call_id : "");
}

function recordTimeline(event) {
  const at = event.at;
  const data = event.data || {};
  if (typeof at !== "number") return;
  if (timeline.start === null) timeline.start = at;
  timeline.lastAt = Math.max(timeline.lastAt ?? at, at);
  switch (event.name) {
    case "model_called": {
      const index = Number(data.llm_call_index);
      const label = "model call " + (index + 1) + (data.purpose === "compaction" ? " (summary)" : "");
      const row = timelineRow("model:" + index, "model", label);
      if (row.start === null) row.start = at;
      row.end = null;
      timeline.openModel = row;
      break;
    }
    case "model_responded":
    case "model_failed": {
      const index = data.llm_call_index;
      const row = index !== undefined && index !== null ? timelineRow("model:" + Number(index), "model") : timeline.openModel;
      if (row) row.end = at;
      break;
    }
    case "approval_requested":
      for (const callId of data.call_ids || []) openWait(toolRow({ call_id: callId }), at, "approval");
      break;
    case "call_waiting":
      toolRow(data);
      break;
    case "approval_given":
      closeWaits(toolRow(data), at);
      break;
    case "tool_dispatched":
    case "tool_redispatched":
      openWait(toolRow(data), at, "queue");
      break;
    case "tool_waiting_for_worker":
      openWait(toolRow(data), at, "worker");
      break;
    case "tool_waiting_for_slot":
      openWait(toolRow(data), at, "slot");
      break;
    case "tool_started":
      closeWaits(toolRow(data), at);
      break;
    case "tool_finished":
    case "tool_synthesized": {
      const row = toolRow(data);
      if (row.start === null) row.start = at;
      closeWaits(row, at);
      row.end = at;
      break;
    }
    case "turn_finished":
      timeline.end = at;
      break;
    default:
      return;
  }
  queueTimeline();
}

function queueTimeline() {
  if (timelineQueued) return;
  timelineQueued = true;
  requestAnimationFrame(() => {
    timelineQueued = false;
    drawTimeline();
  });
}

function svg(tag, attributes, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function drawTimeline() {
  const rows = [...timeline.rows.values()].filter((row) => row.start !== null);
  if (timeline.start === null || rows.length === 0) return;
  // While the turn runs its bars grow to now (never before its last event, whatever this machine's clock).
  const now = timeline.end ?? Math.max(timeline.lastAt, finished ? timeline.lastAt : Date.now() / 1000);
  const span = Math.max(now - timeline.start, 0.001);
  const x = (at) => TL_LABEL + ((Math.min(at, now) - timeline.start) / span) * (TL_WIDTH - TL_LABEL - 4);
  const height = rows.length * TL_ROW + TL_AXIS;
  const root = svg("svg", { viewBox: `0 0 ${TL_WIDTH} ${height}`, width: "100%", role: "img" });
  root.append(svg("title", {}, "model calls and tool calls over " + formatMs(span * 1000)));
  rows.sort((a, b) => a.start - b.start);
  rows.forEach((row, index) => {
    const y = index * TL_ROW;
    const group = svg("g", { class: "tl-row", "data-key": row.key });
    group.append(svg("text", { class: "tl-label", x: 0, y: y + TL_ROW * 0.7 }, row.label || row.key));
    const end = row.end ?? now;
    const bar = svg("rect", {
      class: "tl-bar tl-" + row.kind + (row.end === null ? " tl-open" : ""),
      "data-kind": row.kind,
      x: x(row.start), y: y + 3, width: Math.max(1.5, x(end) - x(row.start)), height: TL_ROW - 6,
    });
    bar.append(svg("title", {}, (row.label || row.key) + ": " + formatMs((end - row.start) * 1000)));
    group.append(bar);
    for (const wait of row.waits) {
      const waitEnd = wait.end ?? now;
      const shade = svg("rect", {
        class: "tl-wait", "data-why": wait.why,
        x: x(wait.start), y: y + 3, width: Math.max(1.5, x(waitEnd) - x(wait.start)), height: TL_ROW - 6,
      });
      shade.append(svg("title", {}, "waiting for " + wait.why + ": " + formatMs((waitEnd - wait.start) * 1000)));
      group.append(shade);
    }
    root.append(group);
  });
  const axisY = rows.length * TL_ROW;
  root.append(svg("line", { class: "tl-axis", x1: TL_LABEL, x2: TL_WIDTH - 4, y1: axisY + 2, y2: axisY + 2 }));
  for (const fraction of [0, 0.25, 0.5, 0.75, 1]) {
    const at = TL_LABEL + fraction * (TL_WIDTH - TL_LABEL - 4);
    const anchor = fraction === 0 ? "start" : fraction === 1 ? "end" : "middle";
    root.append(svg("text", { class: "tl-tick", x: at, y: axisY + 17, "text-anchor": anchor }, formatMs(fraction * span * 1000)));
  }
  byId("timeline").replaceChildren(root);
  byId("timeline-section").hidden = false;
}

// --- approvals --------------------------------------------------------------------------------------------
// The calls the turn waits on come from its view (GET /v1/turns/{id}: redacted arguments, since when they
// wait), read again whenever an event says the waits changed. A reader whose key may approve gets a form per
// call: its arguments as JSON to edit (checked here, then against the tool's schema by the API), a message,
// and approve / deny, POSTed with the session's CSRF token.

const approvalCards = new Map(); // call id -> its card
let approvalsRead = null; // the read in flight, so that bursts of events read the view once

function describeWait(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}

function tickApprovals() {
  const now = Date.now() / 1000;
  for (const card of approvalCards.values()) {
    if (card.since !== null) card.waited.textContent = "waiting " + describeWait(now - card.since);
    if (card.deadline !== null) {
      card.deadline.textContent = "· answered " + (card.onTimeout || "denied") + " by itself in " + describeWait(card.deadlineAt - now);
    }
  }
}

// The edited arguments: null when unchanged (the model's own are run: the shown ones are redacted), else
// the object typed; an Error saying what is wrong with what was typed.
function parseEdited(card) {
  const text = card.args.value;
  if (text.trim() === card.original.trim()) return null;
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new Error("the arguments are not JSON: " + error.message);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new Error("the arguments must be a JSON object");
  }
  if (text.includes('"***"')) throw new Error('replace the redacted "***" values, or leave the arguments as they were');
  return value;
}

function describeRefusal(status, body) {
  const detail = body && body.detail;
  if (Array.isArray(detail)) return detail.map((item) => item.msg).join("; ");
  if (typeof detail === "string") return detail;
  return "HTTP " + status;
}

async function answer(card, approved) {
  card.error.textContent = "";
  const body = { approved };
  try {
    if (approved) {
      const edited = parseEdited(card);
      if (edited !== null) body.arguments = edited;
    }
  } catch (error) {
    card.error.textContent = error.message;
    return;
  }
  if (card.message.value.trim()) body.reason = card.message.value.trim();
  for (const button of card.buttons) button.disabled = true;
  try {
    const reply = await fetch(base + "/approvals/" + encodeURIComponent(card.callId), {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Toolloop-CSRF": csrfToken },
      body: JSON.stringify(body),
    });
    if (reply.ok) {
      card.root.dataset.state = approved ? "approved" : "denied";
      card.state.textContent = approved ? "approved" : "denied";
      return;
    }
    const refusal = await reply.json().catch(() => null);
    card.error.textContent = "refused: " + describeRefusal(reply.status, refusal);
  } catch (error) {
    card.error.textContent = "could not send: " + error;
  }
  for (const button of card.buttons) button.disabled = false;
}

function approvalCard(pending) {
  const root = element("div", "approval");
  root.dataset.callId = pending.call_id;
  root.dataset.state = "waiting";
  const head = element("div", "head");
  const state = element("span", "state status", "waiting");
  const waited = element("span", "waited muted");
  const deadline = element("span", "deadline muted");
  head.append(element("strong", "name", pending.tool), element("code", "call-id", pending.call_id), state, waited, deadline);
  const original = JSON.stringify(pending.arguments || {}, null, 2);
  const card = {
    root, state, waited, callId: pending.call_id, original, since: pending.since ?? null,
    deadline: pending.wait_deadline ? deadline : null, deadlineAt: pending.wait_deadline, onTimeout: pending.on_timeout,
    buttons: [],
  };
  root.append(head);
  if (!canApprove) {
    root.append(element("pre", "arguments", original));
    root.append(element("p", "muted", "This key may not approve: answer with a key that has the approve scope."));
    return card;
  }
  const args = element("textarea", "arguments");
  args.value = original;
  args.rows = Math.min(12, original.split("\n").length + 1);
  args.spellcheck = false;
  args.setAttribute("aria-label", "arguments (JSON)");
  const message = element("input", "message");
  message.type = "text";
  message.placeholder = "message (a denial's reason, which the model reads)";
  message.maxLength = 2000;
  const approve = element("button", "approve", "Approve");
  const deny = element("button", "deny", "Deny");
  approve.type = deny.type = "button";
  const error = element("p", "error");
  Object.assign(card, { args, message, error, buttons: [approve, deny] });
  approve.addEventListener("click", () => answer(card, true));
  deny.addEventListener("click", () => answer(card, false));
  args.addEventListener("input", () => {
    try {
      parseEdited(card);
      error.textContent = "";
    } catch (problem) {
      error.textContent = problem.message;
    }
  });
  const actions = element("div", "actions");
  actions.append(approve, " ", deny);
  root.append(args, message, actions, error);
  return card;
}

function describeWaitingFor(pending) {
  const approvals = pending.filter((p) => p.waiting_for === "approval").map((p) => p.tool);
  const results = pending.filter((p) => p.waiting_for === "client_result").map((p) => p.tool);
  const children = pending.filter((p) => p.waiting_for === "child_turn").map((p) => p.tool);
  const parts = [];
  if (approvals.length) parts.push("approval of " + approvals.join(", "));
  if (results.length) parts.push("the result of " + results.join(", "));
  if (children.length) parts.push("the child turn of " + children.join(", "));
  return parts.length ? "waiting for " + parts.join(" and ") : "";
}

function showApprovals(view) {
  const pending = finished ? [] : view.pending_approvals || [];
  const waitingFor = byId("waiting-for");
  waitingFor.textContent = describeWaitingFor(pending);
  waitingFor.hidden = !waitingFor.textContent;
  const waiting = pending.filter((p) => p.waiting_for === "approval");
  const ids = new Set(waiting.map((p) => p.call_id));
  for (const [callId, card] of approvalCards) {
    if (!ids.has(callId)) {
      card.root.remove();
      approvalCards.delete(callId);
    }
  }
  for (const item of waiting) {
    if (!approvalCards.has(item.call_id)) {
      const card = approvalCard(item);
      approvalCards.set(item.call_id, card);
      byId("approvals").append(card.root);
    }
  }
  byId("approvals-section").hidden = approvalCards.size === 0;
  tickApprovals();
}

function refreshApprovals() {
  if (approvalsRead) return;
  approvalsRead = readView()
    .then((view) => {
      if (!view.missing) showApprovals(view);
    })
    .catch(() => {})
    .finally(() => {
      approvalsRead = null;
    });
}

// --- the turn ---------------------------------------------------------------------------------------------

// A fallback list (before turn_started names the model resolved) shows in the order it is tried.
function showModel(model) {
  const shown = Array.isArray(model) ? model.join(" → ") : model;
  if (shown) byId("turn-model").textContent = "· " + shown;
}

// The forks of a turn link both ways: the fork's request names the turn it was forked from (forked_from), and
// the turn's view lists its forks. Ids go in as text, and into links as encoded path segments.
function turnLink(id) {
  const link = element("a", null, id);
  link.href = "/ui/turns/" + encodeURIComponent(id);
  return link;
}

// A turn says where else it came from the same way: a schedule's run names its schedule (request.schedule), a
// sub-agent's child turn links its parent (request.parent).
function showLinks(view) {
  const node = byId("turn-links");
  node.replaceChildren();
  const parts = [];
  const schedule = view.request.schedule;
  if (schedule) parts.push(["run of schedule ", element("strong", "schedule-name", schedule)]);
  const parent = view.request.parent;
  if (parent) parts.push(["child turn of ", turnLink(parent.turn_id), " (its call " + parent.call_id + ")"]);
  const from = view.request.forked_from;
  if (from) parts.push(["forked from ", turnLink(from.turn_id), " at message " + from.at]);
  const forks = view.forks || [];
  if (forks.length) {
    const part = ["forks: "];
    forks.forEach((fork, index) => {
      if (index) part.push(", ");
      part.push(turnLink(fork.turn_id), " (at message " + fork.at + ")");
    });
    parts.push(part);
  }
  parts.forEach((part, index) => {
    if (index) node.append(" · ");
    node.append(...part);
  });
  node.hidden = parts.length === 0;
}

// --- agents -----------------------------------------------------------------------------------------------
// Which agent answered what: the turn's own agent at the top (and the one it was handed off to, once it
// has been), each handoff in the transcript where it happened, and the child turns its sub-agent calls
// started, each with its agent, its status, a link to its page, and the calls it waits on a person for
// (approved on the child's page, or through this turn's API).

const children = new Map(); // child turn id -> its entry
let requestAgent = null; // the agent the turn was submitted as
let currentAgent = null; // the agent answering now (the last handed off to)

function showAgent() {
  const node = byId("turn-agent");
  node.replaceChildren();
  if (!requestAgent && !currentAgent) {
    node.hidden = true;
    return;
  }
  node.append("agent ", element("strong", "agent-name", requestAgent || "none"));
  if (currentAgent && currentAgent !== requestAgent) {
    node.append(" · handed off to ", element("strong", "agent-name", currentAgent));
  }
  node.hidden = false;
}

function onAgentHandoff(data) {
  const card = toolCalls.get(data.call_id);
  // The transfer call is answered at once, by toolloop: its card (when the model streamed it) says so.
  if (card) setPhase(card, "finished", "handed off");
  const index = card ? card.llmCall : currentCall === null ? 0 : currentCall;
  const line = element("p", "handoff notice", "handed off from " + (data.from_agent || "no agent") + " to " + data.to_agent);
  line.dataset.callId = data.call_id;
  llmCall(index).tools.append(line);
  currentAgent = data.to_agent;
  showAgent();
}

function childEntry(childId, agent) {
  let entry = children.get(childId);
  if (entry) return entry;
  const root = element("li", "child");
  root.dataset.childTurnId = childId;
  const status = element("span", "status");
  const waits = element("div", "child-waits");
  root.append(element("strong", "agent-name", agent), " ", status, " ", turnLink(childId), waits);
  byId("children").append(root);
  byId("children-section").hidden = false;
  entry = { root, status, waits, waiting: new Map() };
  children.set(childId, entry);
  return entry;
}

function setChildStatus(entry, status) {
  entry.status.dataset.status = status || "running";
  entry.status.textContent = status || "running";
  if (status) {
    entry.waiting.clear();
    entry.waits.replaceChildren();
  }
}

// A sub-agent's call runs as a child turn, not on a worker: its card says so and links the child's page.
function onChildTurnStarted(data) {
  setChildStatus(childEntry(data.child_turn_id, data.agent), null);
  const card = toolCard(data.call_id, data.agent);
  setPhase(card, "running", "running as a child turn");
  if (!card.child) {
    card.child = turnLink(data.child_turn_id);
    card.child.className = "child-link";
    card.root.querySelector(".head").append(card.child);
  }
}

function onChildTurnFinished(data) {
  setChildStatus(childEntry(data.child_turn_id, data.agent), data.status);
  const card = toolCalls.get(data.call_id);
  if (!card) return;
  setPhase(card, "finished", "child turn " + data.status);
  card.fields.outcome.dataset.status = data.ok ? "ok" : "error";
  card.fields.outcome.textContent = data.ok ? "ok" : "error";
}

function showChildren(view) {
  for (const child of view.children || []) setChildStatus(childEntry(child.turn_id, child.agent), child.status);
}

function onChildCallWaiting(data) {
  const entry = childEntry(data.child_turn_id, data.agent || "?");
  if (entry.waiting.has(data.call_id)) return;
  const line = element("p", "waiting-for child-wait");
  line.dataset.callId = data.call_id;
  const link = element("a", null, "approve it on the child's page");
  link.href = "/ui/turns/" + encodeURIComponent(data.child_turn_id);
  line.append("waiting for approval of " + (data.tool || "a call") + " (" + data.call_id + "): ", link);
  entry.waiting.set(data.call_id, line);
  entry.waits.append(line);
}

async function readView() {
  const reply = await fetch(base, { credentials: "same-origin", cache: "no-store" });
  return reply.ok ? reply.json() : { missing: reply.status };
}

function showAnswer(outcome) {
  // A turn whose model calls did not stream (older turns) has no text deltas: its answer is the outcome's.
  if (sawText || !outcome || !outcome.text) return;
  byId("final-answer").textContent = outcome.text;
  byId("final-answer-box").hidden = false;
}

async function finish(status, summary) {
  finished = true;
  if (source) source.close();
  showApprovals({});
  setStatus(status);
  byId("stream-state").textContent = "";
  if (summary) byId("turn-summary").textContent = summary;
  const view = await readView();
  showAnswer(view.outcome);
  if (view.request) showLinks(view);
  if (view.outcome && view.outcome.agent) currentAgent = view.outcome.agent;
  showAgent();
  showChildren(view);
}

function onTurnFinished(data, event) {
  const parts = [data.stop_reason ? "stop reason: " + data.stop_reason : ""];
  parts.push(data.llm_calls + " model call(s)", data.tool_executions + " tool execution(s)");
  if (queuedAt !== null) parts.push("in " + formatMs((event.at - queuedAt) * 1000) + " from its submission");
  finish(data.status, "· " + parts.filter(Boolean).join(", "));
}

const HANDLERS = {
  turn_queued: (data, event) => {
    queuedAt = event.at;
    setStatus("queued");
    showModel(data.model);
  },
  turn_started: (data) => {
    setStatus("running");
    showModel(data.model);
  },
  turn_resumed: () => setStatus("running", "running (resumed by another orchestrator)"),
  model_called: onModelCalled,
  model_responded: onModelResponded,
  model_failed: onModelFailed,
  model_empty_answer: onEmptyAnswer,
  text_delta: onTextDelta,
  thinking_delta: onThinkingDelta,
  model_stream_reset: onStreamReset,
  tool_call_started: onToolCallStarted,
  tool_dispatched: onToolDispatched,
  tool_started: onToolStarted,
  // Sent while no live worker serves the tool (a restart, a deploy): it waits in its queue; a start ends it.
  tool_waiting_for_worker: (data) => setPhase(toolCard(data.call_id, data.tool), "waiting", "waiting for a worker"),
  tool_waiting_for_slot: (data) => setPhase(toolCard(data.call_id, data.tool), "waiting", "waiting for a slot"),
  tool_progress: onToolProgress,
  tool_finished: (data) => onToolEnded(data, false),
  tool_synthesized: (data) => onToolEnded(data, true),
  tool_redispatched: onToolRedispatched,
  tool_synthesis_requested: (data) => setPhase(toolCard(data.call_id, data.tool), "ending", "ending: " + data.failure_kind),
  approval_requested: onApprovalRequested,
  approval_given: (data) => {
    // Who decided, and why, as the events record it (decided_by, reason).
    let label = data.approved ? "approved" : "denied";
    if (data.decided_by) label += " by " + data.decided_by;
    if (data.reason) label += ": " + data.reason;
    const card = toolCard(data.call_id, data.tool);
    setPhase(card, "dispatched", data.approved ? "approved" : "denied");
    // Kept on the card once the call has run (its status moves on).
    if (!card.decision) {
      card.decision = element("div", "decision muted");
      card.root.append(card.decision);
    }
    card.decision.textContent = label;
    refreshApprovals();
  },
  call_waiting: () => refreshApprovals(),
  agent_handoff: onAgentHandoff,
  agent_depth_reached: () => {},
  child_turn_started: onChildTurnStarted,
  child_turn_finished: onChildTurnFinished,
  child_call_waiting: onChildCallWaiting,
  late_outcome: () => {},
  turn_stopping: (data) => {
    byId("turn-summary").textContent = "· stopping: " + (data.message || data.reason);
  },
  context_trimmed: () => {},
  context_compacted: () => {},
  context_compaction_failed: () => {},
  context_exceeded: () => {},
  turn_finished: onTurnFinished,
};
const QUIET = new Set(["text_delta", "thinking_delta", "tool_progress"]);

function logEvent(event) {
  eventCount += 1;
  byId("event-count").textContent = eventCount + " events";
  if (QUIET.has(event.name)) return;
  const log = byId("event-log");
  const time = new Date(event.at * 1000).toLocaleTimeString();
  log.append(element("li", null, time + " " + event.name + " " + JSON.stringify(event.data)));
  while (log.childElementCount > LOG_LIMIT) log.firstElementChild.remove();
}

function receive(message) {
  const event = JSON.parse(message.data);
  logEvent(event);
  recordTimeline(event);
  HANDLERS[event.name](event.data || {}, event);
}

async function onStreamError() {
  if (finished) return;
  if (source.readyState === EventSource.CLOSED) {
    byId("stream-state").textContent = "· the stream was refused (reload the page to try again)";
    return;
  }
  byId("stream-state").textContent = "· reconnecting…";
  // A turn that ended without its turn_finished left in the stream would be reconnected to forever.
  const view = await readView().catch(() => ({}));
  if (!finished && TERMINAL.has(view.status)) {
    await finish(view.status, "");
  }
}

async function start() {
  byId("turn-id").textContent = turnId;
  const view = await readView();
  if (view.missing) {
    setStatus("unknown", view.missing === 404 ? "unknown turn (expired, or never submitted)" : "HTTP " + view.missing);
    return;
  }
  const users = (view.request.messages || []).filter((m) => m.role === "user");
  const prompt = view.request.prompt || (users.length ? users[users.length - 1].content : "");
  if (prompt) {
    byId("prompt").textContent = prompt;
    byId("prompt-section").hidden = false;
  }
  // A status that says the turn ended is set by its turn_finished event, once everything before it is shown.
  setStatus(TERMINAL.has(view.status) ? "" : view.status, view.status + ", loading its events…");
  showModel(view.request.model);
  showLinks(view);
  requestAgent = view.request.agent || null;
  currentAgent = (view.outcome && view.outcome.agent) || requestAgent;
  showAgent();
  showChildren(view);
  showApprovals(view);
  setInterval(() => {
    tickApprovals();
    if (!finished) queueTimeline();
  }, 1000);
  source = new EventSource(base + "/events", { withCredentials: true });
  source.onopen = () => {
    if (!finished) byId("stream-state").textContent = "· live";
  };
  source.onerror = onStreamError;
  for (const name of Object.keys(HANDLERS)) source.addEventListener(name, receive);
}

start();

// The recent turns, from GET /v1/turns, refreshed every few seconds. Every value goes in as text.
// `/ui?tenant=acme` lists one tenant's turns (a tenant cell links there).
"use strict";

const REFRESH_MS = 3000;
const TENANT = new URLSearchParams(window.location.search).get("tenant");
const LISTING = "/v1/turns?limit=50" + (TENANT ? "&tenant=" + encodeURIComponent(TENANT) : "");
const tbody = document.querySelector("#turns tbody");
const state = document.getElementById("listing-state");

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

const TERMINAL = new Set(["completed", "stopped", "failed", "cancelled"]);

function describeDuration(turn) {
  if (turn.duration_s !== null) return turn.duration_s.toFixed(1) + " s";
  if (TERMINAL.has(turn.status)) return ""; // its end is not read yet
  const since = turn.started_at || turn.submitted_at;
  return since ? "running " + Math.max(0, Date.now() / 1000 - since).toFixed(0) + " s" : "";
}

function describeTools(tools) {
  return Object.entries(tools).map(([name, count]) => (count > 1 ? name + " ×" + count : name)).join(", ");
}

function render(turns) {
  const rows = turns.map((turn) => {
    const row = document.createElement("tr");
    row.dataset.turnId = turn.turn_id;
    const link = document.createElement("a");
    link.href = "/ui/turns/" + encodeURIComponent(turn.turn_id);
    link.textContent = turn.turn_id;
    row.insertCell().append(link);
    cell(row, turn.status, "status").dataset.status = turn.status;
    const tenant = document.createElement("a");
    tenant.href = "/ui?tenant=" + encodeURIComponent(turn.tenant);
    tenant.textContent = turn.tenant;
    row.insertCell().append(tenant);
    cell(row, turn.model || "");
    cell(row, turn.submitted_at ? new Date(turn.submitted_at * 1000).toLocaleString() : "");
    cell(row, describeDuration(turn));
    cell(row, describeTools(turn.tools));
    return row;
  });
  tbody.replaceChildren(...rows);
  state.textContent = turns.length ? "" : "no turns yet";
}

async function refresh() {
  try {
    const reply = await fetch(LISTING, { credentials: "same-origin", cache: "no-store" });
    if (!reply.ok) {
      state.textContent = "could not list the turns: HTTP " + reply.status;
    } else {
      render((await reply.json()).turns);
    }
  } catch (error) {
    state.textContent = "could not list the turns: " + error;
  }
  setTimeout(refresh, REFRESH_MS);
}

refresh();

// The recent turns, from GET /v1/turns, refreshed every few seconds; the turns waiting for someone first,
// then newest first. Every value goes in as text. `/ui?status=waiting&tenant=acme&model=m` lists only the
// turns with that status, of that tenant, of that model (the filter form, or a tenant or model cell's link).
"use strict";

const REFRESH_MS = 3000;
const FILTERS = ["status", "tenant", "model"];
const given = new URLSearchParams(window.location.search);
const listing = new URLSearchParams({ limit: "50" });
for (const name of FILTERS) {
  const value = (given.get(name) || "").trim();
  if (value) listing.set(name, value);
  document.getElementById("filter-" + name).value = value;
}
const LISTING = "/v1/turns?" + listing.toString();
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

// A link to this listing with one more filter: the cell's value.
function filterLink(name, value) {
  const query = new URLSearchParams(listing);
  query.delete("limit");
  query.set(name, value);
  const link = document.createElement("a");
  link.href = "/ui?" + query.toString();
  link.textContent = value;
  return link;
}

// Waiting turns first (someone has to act on them), each group newest first as listed.
function byAttention(turns) {
  return [...turns.filter((t) => t.status === "waiting"), ...turns.filter((t) => t.status !== "waiting")];
}

function render(listed) {
  const turns = byAttention(listed);
  const rows = turns.map((turn) => {
    const row = document.createElement("tr");
    row.dataset.turnId = turn.turn_id;
    row.dataset.status = turn.status;
    const link = document.createElement("a");
    link.href = "/ui/turns/" + encodeURIComponent(turn.turn_id);
    link.textContent = turn.turn_id;
    row.insertCell().append(link);
    cell(row, turn.status, "status").dataset.status = turn.status;
    row.insertCell().append(filterLink("tenant", turn.tenant));
    if (turn.model) row.insertCell().append(filterLink("model", turn.model));
    else cell(row, "");
    cell(row, turn.submitted_at ? new Date(turn.submitted_at * 1000).toLocaleString() : "");
    cell(row, describeDuration(turn));
    cell(row, describeTools(turn.tools));
    return row;
  });
  tbody.replaceChildren(...rows);
  state.textContent = turns.length ? "" : [...listing.keys()].length > 1 ? "no turns match these filters" : "no turns yet";
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

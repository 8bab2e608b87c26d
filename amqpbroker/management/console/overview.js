// The overview: every queue with its depth, consumers, rates and age, sortable and
// filterable; dead-letter and expiry queues in a table of their own; growing ones
// highlighted. Plus the replay tasks.

import { get, post, q } from "./api.js";
import { confirmAction, state, status } from "./app.js";
import { duration, fill, h, num, rate } from "./dom.js";

const COLUMNS = [
  { key: "name", label: "Queue", text: true },
  { key: "address", label: "Address", text: true },
  { key: "routing_type", label: "Routing", text: true },
  { key: "kind", label: "Kind", text: true, value: (r) => r.kind.join(" ") },
  { key: "messages", label: "Depth" },
  { key: "delivering", label: "Delivering" },
  { key: "consumers", label: "Consumers" },
  { key: "oldest_age_s", label: "Oldest" },
  { key: "added_rate", label: "Added/s", value: (r) => r.rates?.added },
  { key: "acked_rate", label: "Acked/s", value: (r) => r.rates?.acknowledged },
  { key: "dead_rate", label: "Dead-lettered/s", value: (r) => r.rates?.dead_lettered },
  { key: "expired_rate", label: "Expired/s", value: (r) => r.rates?.expired },
];
const valueOf = (col, row) => (col.value ? col.value(row) : row[col.key]);

function cell(col, row) {
  const v = valueOf(col, row);
  if (col.key === "name") {
    return h("td", {},
      h("a", { href: `#/queue/${q(row.name)}`, class: "queue-link" }, row.name),
      row.role === "dlq" ? h("span", { class: "badge dlq" }, "DLQ") : null,
      row.role === "expiry" ? h("span", { class: "badge expiry" }, "expiry") : null,
      row.growing ? h("span", { class: "badge growing", title: "depth grew over the last samples" }, "▲ growing") : null);
  }
  if (col.key === "kind") return h("td", {}, row.kind.map((k) => h("span", { class: "kind" }, k)));
  if (col.key === "oldest_age_s") return h("td", { class: "num" }, duration(v));
  if (col.text) return h("td", {}, v ?? "");
  if (col.key.endsWith("_rate")) return h("td", { class: "num" }, rate(v));
  return h("td", { class: "num" }, num(v));
}

/** One sortable table of queue rows; `rows` set by `update`. */
function queueTable(id, caption, sortState) {
  const head = h("tr", {});
  const body = h("tbody", {});
  const table = h("table", { class: "grid", id },
    h("caption", {}, caption), h("thead", {}, head), body);
  let rows = [];
  let shownFilter = "";
  const drawHead = () => fill(head, COLUMNS.map((col) => h("th", {
    class: `${col.text ? "" : "num"} sortable${sortState.key === col.key ? ` sorted ${sortState.dir}` : ""}`,
    dataset: { key: col.key },
    onclick: () => {
      sortState.dir = sortState.key === col.key && sortState.dir === "asc" ? "desc" : "asc";
      sortState.key = col.key;
      drawHead();
      render(shownFilter);
    },
  }, col.label)));
  drawHead();
  const render = (filter) => {
    shownFilter = filter;
    const col = COLUMNS.find((c) => c.key === sortState.key) || COLUMNS[0];
    const needle = filter.trim().toLowerCase();
    const shown = rows.filter((r) => !needle || [r.name, r.address, r.kind.join(" ")]
      .some((s) => s.toLowerCase().includes(needle)));
    shown.sort((a, b) => {
      const x = valueOf(col, a) ?? -1;
      const y = valueOf(col, b) ?? -1;
      const order = typeof x === "string" ? x.localeCompare(y) : x - y;
      return sortState.dir === "asc" ? order : -order;
    });
    fill(body, shown.length ? shown.map((r) => h("tr", {
      class: [r.role ? `role-${r.role}` : "", r.growing ? "growing" : ""].join(" ").trim(),
      dataset: { queue: r.name },
    }, COLUMNS.map((c) => cell(c, r))))
      : h("tr", {}, h("td", { colspan: COLUMNS.length, class: "muted" }, "no queues")));
  };
  return { table, render, set: (r) => { rows = r; } };
}

/** The replay tasks (all, or one queue's), with progress and cancel. */
export function tasksPanel(queue) {
  const body = h("tbody", {});
  const section = h("section", { class: "tasks", id: "tasks" },
    h("h2", {}, "Replay tasks"),
    h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, ["Task", "Kind", "From", "To", "Rate", "Progress", "Status", "Result", ""]
        .map((t) => h("th", {}, t)))),
      body));
  const refresh = async () => {
    let tasks = await get("/api/v1/tasks");
    if (queue) tasks = tasks.filter((t) => t.queue === queue);
    section.hidden = tasks.length === 0;
    fill(body, tasks.map((t) => {
      const pct = t.total ? Math.round((100 * t.done) / t.total) : 100;
      const result = t.kind === "retry" ? `${num(t.retried)} retried` : `${num(t.moved)} moved`;
      const extra = t.skipped?.length || t.not_found?.length
        ? `, ${t.skipped.length} skipped, ${t.not_found.length} not found` : "";
      return h("tr", { dataset: { task: t.id }, class: `task-${t.status}` },
        h("td", { class: "mono" }, t.id),
        h("td", {}, t.kind),
        h("td", {}, t.queue),
        h("td", {}, t.kind === "retry" ? "original address" : t.to_queue),
        h("td", { class: "num" }, `${rate(t.rate)}/s`),
        h("td", {}, h("progress", { max: t.total || 1, value: t.done }), ` ${num(t.done)}/${num(t.total)} (${pct}%)`),
        h("td", { class: "task-status" }, t.status + (t.error ? `: ${t.error}` : "")),
        h("td", {}, result + extra),
        h("td", {}, t.status === "running" && state.broker?.may_manage
          ? h("button", { type: "button", class: "small", onclick: async () => {
            if (!(await confirmAction("Cancel task", `Cancel task ${t.id} at ${t.done}/${t.total}? Messages already handled stay where they went.`, "Cancel task"))) return;
            try {
              await post(`/api/v1/tasks/${q(t.id)}/cancel`);
              status(`task ${t.id} cancelled`);
              await refresh();
            } catch (e) { status(e.message, "error"); }
          } }, "Cancel") : null));
    }));
  };
  return { element: section, refresh };
}

export function overview() {
  const sortMain = { key: "name", dir: "asc" };
  const sortDead = { key: "messages", dir: "desc" };
  const main = queueTable("queues", "Queues", sortMain);
  const dead = queueTable("dead-queues", "Dead-letter and expiry queues", sortDead);
  const tasks = state.broker?.tasks ? tasksPanel(null) : null;
  const filter = h("input", {
    type: "search", id: "queue-filter", placeholder: "filter by queue, address or kind",
    oninput: () => { main.render(filter.value); dead.render(filter.value); },
  });
  const element = h("div", { class: "overview" },
    h("div", { class: "toolbar" }, h("label", {}, "Filter ", filter),
      h("span", { class: "muted" }, "refreshes every few seconds · rates over the last 30 s")),
    dead.table, main.table, tasks ? tasks.element : null);
  return {
    element,
    async refresh() {
      const rows = await get("/api/v1/overview");
      main.set(rows.filter((r) => !r.role));
      dead.set(rows.filter((r) => r.role));
      main.render(filter.value);
      dead.render(filter.value);
      if (tasks) await tasks.refresh();
    },
  };
}

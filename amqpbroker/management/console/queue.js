// One queue: its facts and chart, a paged browse with a selector filter, a message's
// detail, and (with `manage`) retry / move / purge of a selection or of all that match,
// each behind a confirmation that says how many messages it will touch.

import { get, getWithHeaders, post, q } from "./api.js";
import { confirmAction, state, status } from "./app.js";
import { chart, legend } from "./chart.js";
import { bytes, duration, fill, h, num, rate, show } from "./dom.js";
import { tasksPanel } from "./overview.js";

const PAGE = 50;
const ann = (m, key) => m.message_annotations?.[key];

function kv(title, object, id) {
  const entries = Object.entries(object || {});
  return h("section", { class: "kv", id },
    h("h3", {}, title),
    entries.length
      ? h("table", {}, h("tbody", {}, entries.map(([k, v]) =>
        h("tr", {}, h("th", {}, k), h("td", { class: "mono" }, show(v))))))
      : h("p", { class: "muted" }, "none"));
}

function detail(m) {
  return h("div", { class: "detail", id: "message-detail" },
    h("h2", {}, `Message ${m.msg_id}`),
    h("p", { class: "muted" },
      `delivery count ${m.delivery_count} · ${m.durable ? "durable" : "not durable"} · priority ${m.priority} · ${bytes(m.size)}`
      + (m.expiration ? ` · expires ${new Date(m.expiration).toISOString()}` : "")),
    m.decode_error ? h("p", { class: "error" }, `Partly unreadable: ${m.decode_error}`) : null,
    h("div", { class: "kv-grid" },
      kv("Properties", m.properties, "detail-properties"),
      kv("Application properties", m.application_properties, "detail-application-properties"),
      kv("Message annotations", m.message_annotations, "detail-annotations")),
    h("section", { class: "kv" }, h("h3", {}, "Body (preview: text escaped, binary as hex)"),
      h("pre", { class: "body", id: "detail-body" }, m.body_preview)));
}

export function queuePage(name) {
  const path = `/api/v1/queues/${q(name)}`;
  const view = { offset: 0, filter: "", total: 0, messages: [], selected: new Set(), all: false, info: null };
  const may = () => Boolean(state.broker?.may_manage);

  const title = h("h1", {}, h("a", { href: "#/" }, "Queues"), " / ", h("span", { id: "queue-name" }, name));
  const facts = h("dl", { class: "facts wide", id: "queue-facts" });
  const chartBox = h("div", { class: "chart-box" });
  const selectorInput = h("input", { type: "text", id: "selector", class: "mono", placeholder: "JMS selector, e.g. color = 'red' AND JMSDeliveryMode = 'PERSISTENT'", size: 60 });
  const filterForm = h("form", { class: "toolbar", id: "filter-form", onsubmit: (e) => { e.preventDefault(); view.filter = selectorInput.value.trim(); view.offset = 0; clearSelection(); loadMessages(); } },
    h("label", {}, "Selector ", selectorInput),
    h("button", { type: "submit", id: "apply-filter" }, "Apply"),
    h("button", { type: "button", onclick: () => { selectorInput.value = ""; filterForm.requestSubmit(); } }, "Clear"));
  const pageCheck = h("input", { type: "checkbox", id: "select-page", title: "select this page", onchange: () => {
    for (const m of view.messages) pageCheck.checked ? view.selected.add(m.msg_id) : view.selected.delete(m.msg_id);
    view.all = false;
    renderRows();
  } });
  const headRow = h("tr", {});
  const rowsBody = h("tbody", {});
  const pager = h("div", { class: "pager", id: "pager" });
  const detailBox = h("div", { class: "detail-box" });
  const scope = h("span", { class: "scope", id: "scope" });
  const rateInput = h("input", { type: "number", id: "retry-rate", min: "0.1", step: "any", placeholder: "at once", class: "rate" });
  const moveTarget = h("select", { id: "move-target" });
  const outcome = h("div", { class: "outcome", id: "outcome", role: "status" });
  const tasks = tasksPanel(name);

  const actions = h("div", { class: "actions", id: "actions" },
    scope,
    h("button", { type: "button", id: "select-all", class: "link", onclick: () => { view.all = true; renderRows(); } }, "select all that match"),
    h("button", { type: "button", class: "link", onclick: () => clearSelection() }, "clear"),
    h("span", { class: "sep" }),
    h("label", {}, "rate ", rateInput, " msg/s"),
    h("button", { type: "button", id: "retry", onclick: () => act("retry") }, "Retry to original address"),
    h("span", { class: "sep" }),
    h("label", {}, "to ", moveTarget),
    h("button", { type: "button", id: "move", onclick: () => act("move") }, "Move"),
    h("span", { class: "sep" }),
    h("button", { type: "button", id: "purge", class: "danger", onclick: () => act("purge") }, "Purge"));

  const element = h("div", { class: "queue-page" },
    title,
    h("div", { class: "queue-head" }, facts, h("div", {}, chartBox, legend())),
    filterForm,
    may() ? actions : null,
    outcome,
    h("table", { class: "grid messages", id: "messages" }, h("thead", {}, headRow), rowsBody),
    pager,
    detailBox,
    tasks.element);

  function clearSelection() {
    view.selected.clear();
    view.all = false;
    renderRows();
  }

  function count() {
    return view.all ? view.total : view.selected.size;
  }

  function dead() {
    return Boolean(view.info?.role) || view.messages.some((m) => ann(m, "x-opt-ORIG-ADDRESS") !== undefined);
  }

  function renderRows() {
    const dl = dead();
    const cols = ["", "Id", "Message-id", "Deliveries", "Age", "Size", "Priority"];
    if (dl) cols.push("Original address", "Original queue", "Reason", "Error condition", "Error description");
    cols.push("Body");
    fill(headRow, cols.map((c, i) => h("th", { class: i >= 3 && i <= 6 ? "num" : "" }, i === 0 ? (may() ? pageCheck : "") : c)));
    const now = Date.now() + (state.broker?.now_ms ? state.broker.now_ms - state.broker.fetched_ms : 0);
    pageCheck.checked = view.messages.length > 0 && view.messages.every((m) => view.all || view.selected.has(m.msg_id));
    fill(rowsBody, view.messages.length ? view.messages.map((m) => {
      const box = h("input", { type: "checkbox", class: "pick", checked: view.all || view.selected.has(m.msg_id), disabled: view.all, onchange: () => {
        box.checked ? view.selected.add(m.msg_id) : view.selected.delete(m.msg_id);
        renderRows();
      } });
      const tds = [
        h("td", {}, may() ? box : null),
        h("td", { class: "mono" }, h("a", { href: "#", class: "open", onclick: (e) => { e.preventDefault(); fill(detailBox, detail(m)); detailBox.scrollIntoView({ block: "nearest" }); } }, String(m.msg_id))),
        h("td", { class: "mono ellipsis", title: show(m.properties?.["message-id"]) }, show(m.properties?.["message-id"])),
        h("td", { class: "num" }, num(m.delivery_count)),
        h("td", { class: "num" }, m.first_ts ? duration((now - m.first_ts) / 1000) : "–"),
        h("td", { class: "num" }, bytes(m.size)),
        h("td", { class: "num" }, m.priority),
      ];
      if (dl) {
        for (const key of ["x-opt-ORIG-ADDRESS", "x-opt-ORIG-QUEUE", "x-opt-DLQ-REASON", "x-opt-DLQ-ERROR-CONDITION", "x-opt-DLQ-ERROR-DESCRIPTION"]) {
          tds.push(h("td", { class: key === "x-opt-DLQ-REASON" ? "reason" : "ellipsis", title: show(ann(m, key)) }, show(ann(m, key))));
        }
      }
      tds.push(h("td", { class: "mono ellipsis body-cell", title: m.body_preview }, m.body_preview));
      return h("tr", { dataset: { msgId: m.msg_id }, class: view.all || view.selected.has(m.msg_id) ? "picked" : "" }, tds);
    }) : h("tr", {}, h("td", { colspan: cols.length, class: "muted" }, view.filter ? "no message matches the selector" : "the queue is empty")));
    const n = count();
    scope.textContent = view.all ? `all ${num(n)} that match selected` : `${num(n)} selected`;
    for (const id of ["retry", "move", "purge"]) {
      const b = element.querySelector(`#${id}`);
      if (b) b.disabled = n === 0;
    }
    const last = Math.min(view.offset + PAGE, view.total);
    fill(pager,
      h("button", { type: "button", id: "prev", disabled: view.offset === 0, onclick: () => { view.offset = Math.max(0, view.offset - PAGE); loadMessages(); } }, "‹ Previous"),
      h("span", { id: "page-info" }, view.total ? `${num(view.offset + 1)}–${num(last)} of ${num(view.total)}` : "0 messages"),
      h("button", { type: "button", id: "next", disabled: last >= view.total, onclick: () => { view.offset += PAGE; loadMessages(); } }, "Next ›"));
  }

  async function loadMessages() {
    const query = `?limit=${PAGE}&offset=${view.offset}` + (view.filter ? `&filter=${encodeURIComponent(view.filter)}` : "");
    try {
      const { data, headers } = await getWithHeaders(`${path}/messages${query}`);
      view.messages = data;
      view.total = Number(headers.get("X-Total-Count") ?? data.length);
      selectorInput.classList.remove("invalid");
    } catch (e) {
      view.messages = [];
      view.total = 0;
      selectorInput.classList.add("invalid");
      status(e.message, "error");
    }
    renderRows();
  }

  function target() {
    return view.all ? (view.filter ? { filter: view.filter } : {}) : { ids: [...view.selected] };
  }

  async function act(kind) {
    const n = count();
    const what = `${num(n)} message${n === 1 ? "" : "s"}${view.all && view.filter ? ` matching ${view.filter}` : ""}`;
    const r = Number(rateInput.value) || null;
    const body = target();
    let text;
    let url;
    if (kind === "retry") {
      text = `Retry ${what} from ${name} to their original address${r ? ` at ${r} msg/s, as a task` : ""}?`;
      url = `${path}/retry`;
      if (r) body.rate = r;
    } else if (kind === "move") {
      if (!moveTarget.value) return status("choose a queue to move to", "error");
      text = `Move ${what} from ${name} to ${moveTarget.value}${r ? ` at ${r} msg/s, as a task` : ""}?`;
      url = `${path}/move`;
      body["to-queue"] = moveTarget.value;
      if (r) body.rate = r;
    } else {
      text = `Purge ${what} from ${name}? They are deleted and cannot be recovered.`;
      url = `${path}/purge`;
    }
    if (view.all) text += " Messages out with a consumer right now are left where they are.";
    if (!(await confirmAction(kind[0].toUpperCase() + kind.slice(1), text, `${kind[0].toUpperCase() + kind.slice(1)} ${num(n)}`))) return;
    try {
      const result = await post(url, body);
      let line;
      if (result.task) {
        line = `task ${result.task.id} started: ${result.task.total} message(s) at ${rate(result.task.rate)}/s`;
      } else if (kind === "retry") {
        line = `retried ${result.retried}` + (result.skipped ? `, skipped ${result.skipped.length}` : "") + (result.not_found ? `, not found ${result.not_found.length}` : "");
      } else if (kind === "move") {
        line = `moved ${result.moved} to ${moveTarget.value}`;
      } else {
        line = `purged ${result.removed}`;
      }
      fill(outcome, h("span", { class: "ok" }, line),
        ...(result.skipped || []).slice(0, 20).map((s) => h("div", { class: "muted" }, `skipped ${s.msg_id}: ${s.reason}`)));
      status(line);
      clearSelection();
      await loadMessages();
      await refreshFacts();
    } catch (e) {
      fill(outcome, h("span", { class: "error" }, e.message));
      status(e.message, "error");
    }
  }

  async function refreshFacts() {
    const info = await get(path);
    view.info = info;
    fill(facts,
      h("dt", {}, "address"), h("dd", {}, info.address),
      h("dt", {}, "routing"), h("dd", {}, info.routing_type),
      h("dt", {}, "kind"), h("dd", {}, info.role === "dlq" ? "dead-letter queue" : info.role === "expiry" ? "expiry queue" : (info.kind.join(", ") || "plain")),
      h("dt", {}, "depth"), h("dd", { id: "depth" }, num(info.messages)),
      h("dt", {}, "delivering"), h("dd", {}, num(info.delivering)),
      h("dt", {}, "consumers"), h("dd", {}, num(info.consumers)),
      h("dt", {}, "oldest"), h("dd", {}, duration(info.oldest_age_s)),
      h("dt", {}, "added"), h("dd", {}, `${num(info.added)} (${rate(info.rates?.added)}/s)`),
      h("dt", {}, "acknowledged"), h("dd", {}, `${num(info.acknowledged)} (${rate(info.rates?.acknowledged)}/s)`),
      h("dt", {}, "dead-lettered"), h("dd", {}, num(info.dead_lettered)),
      h("dt", {}, "expired"), h("dd", {}, num(info.expired)),
      info.filter ? [h("dt", {}, "filter"), h("dd", { class: "mono" }, info.filter)] : null);
    fill(chartBox, chart(await get(`${path}/samples`)));
  }

  let first = true;
  return {
    element,
    async refresh() {
      await refreshFacts();
      if (state.broker?.tasks) await tasks.refresh();
      if (first) {
        first = false;
        if (may()) {
          const queues = await get("/api/v1/queues");
          fill(moveTarget, h("option", { value: "" }, "choose a queue"),
            queues.filter((x) => x.name !== name).map((x) => h("option", { value: x.name }, x.name)));
        }
        await loadMessages();
      }
    },
  };
}

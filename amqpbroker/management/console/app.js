// The console's shell: the header (broker facts), the router (#/ and #/queue/NAME),
// the periodic refresh, the confirmation dialog and the status line.

import { get } from "./api.js";
import { duration, fill, h, num } from "./dom.js";
import { overview } from "./overview.js";
import { queuePage } from "./queue.js";

export const state = { broker: null, timer: null, view: null };

const $ = (id) => document.getElementById(id);

/** Show an outcome or an error in the header's status line. */
export function status(text, kind = "ok") {
  const el = $("status");
  el.textContent = text;
  el.className = `status ${kind}`;
}

/** Ask before an action: resolves true when the operator confirms. */
export function confirmAction(title, text, okLabel) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = okLabel;
  return new Promise((resolve) => {
    const done = (answer) => {
      $("confirm-ok").onclick = null;
      $("confirm-cancel").onclick = null;
      dialog.onclose = null;
      if (dialog.open) dialog.close();
      resolve(answer);
    };
    $("confirm-ok").onclick = () => done(true);
    $("confirm-cancel").onclick = () => done(false);
    dialog.onclose = () => done(false);
    dialog.showModal();
  });
}

async function header() {
  const b = await get("/api/v1/broker");
  b.fetched_ms = Date.now(); // with b.now_ms: ages by the broker's clock
  state.broker = b;
  $("broker-name").textContent = b.name;
  fill($("broker-facts"),
    h("dt", {}, "version"), h("dd", {}, b.version),
    h("dt", {}, "uptime"), h("dd", {}, duration(b.uptime_s)),
    h("dt", {}, "connections"), h("dd", { id: "connections" }, num(b.connections)),
    h("dt", {}, "addresses"), h("dd", {}, num(b.addresses)),
    h("dt", {}, "queues"), h("dd", {}, num(b.queues)));
  $("report-link").hidden = !b.analyze_report;
  $("user").textContent = b.user ? `${b.user}${b.may_manage ? "" : " (read-only)"}` : "";
  document.body.classList.toggle("read-only", !b.may_manage);
}

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const match = hash.match(/^\/queue\/(.+)$/);
  if (match) {
    let name;
    try {
      name = decodeURIComponent(match[1]);
    } catch {
      name = match[1];
    }
    return queuePage(name);
  }
  return overview();
}

async function refresh() {
  try {
    await header();
    if (state.view) await state.view.refresh();
    if ($("status").classList.contains("stale")) status("");
  } catch (e) {
    status(`refresh failed: ${e.message}`, "error stale");
  }
}

async function navigate() {
  if (state.view && state.view.leave) state.view.leave();
  state.view = route();
  fill($("view"), state.view.element);
  await refresh();
}

async function start() {
  try {
    await header();
  } catch (e) {
    fill($("view"), h("p", { class: "error" }, `Cannot read the broker: ${e.message}`));
    return;
  }
  const every = Math.max(2, Math.min(state.broker.sample_interval_s, 5)) * 1000;
  window.addEventListener("hashchange", navigate);
  await navigate();
  state.timer = setInterval(refresh, every);
}

start();

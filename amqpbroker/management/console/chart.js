// A small SVG chart of one queue's samples (depth and rates), drawn from the broker's own
// ring of samples (GET /api/v1/queues/{name}/samples): no library, no other service.

import { num, rate } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const SERIES = [
  { key: "messages", label: "depth", cls: "s-depth", axis: "left" },
  { key: "added", label: "added/s", cls: "s-added", axis: "right" },
  { key: "acknowledged", label: "acked/s", cls: "s-acked", axis: "right" },
  { key: "dead_lettered", label: "dead-lettered/s", cls: "s-dead", axis: "right" },
];

function svg(tag, attrs = {}, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

/** An <svg> of the samples; `width`×`height` in CSS pixels. */
export function chart(samples, { width = 520, height = 120 } = {}) {
  const pad = { l: 44, r: 44, t: 8, b: 18 };
  const root = svg("svg", {
    class: "chart",
    viewBox: `0 0 ${width} ${height}`,
    width,
    height,
    role: "img",
    "aria-label": "depth and rates over the last minutes",
  });
  const w = width - pad.l - pad.r;
  const hgt = height - pad.t - pad.b;
  root.append(svg("rect", { x: pad.l, y: pad.t, width: w, height: hgt, class: "plot" }));
  if (samples.length < 2) {
    root.append(svg("text", { x: pad.l + w / 2, y: pad.t + hgt / 2, class: "empty" },
      "collecting samples…"));
    return root;
  }
  const t0 = samples[0].t;
  const t1 = samples[samples.length - 1].t;
  const x = (t) => pad.l + ((t - t0) / Math.max(t1 - t0, 1e-9)) * w;
  const maxOf = (axis) => Math.max(1, ...SERIES.filter((s) => s.axis === axis)
    .flatMap((s) => samples.map((p) => p[s.key] ?? 0)));
  const max = { left: maxOf("left"), right: maxOf("right") };
  for (const [axis, xpos, anchor] of [["left", pad.l - 4, "end"], ["right", pad.l + w + 4, "start"]]) {
    const fmt = axis === "left" ? num : rate;
    root.append(svg("text", { x: xpos, y: pad.t + 8, class: "tick", "text-anchor": anchor }, fmt(max[axis])));
    root.append(svg("text", { x: xpos, y: pad.t + hgt, class: "tick", "text-anchor": anchor }, "0"));
  }
  const minutes = Math.round((t1 - t0) / 60);
  root.append(svg("text", { x: pad.l, y: height - 4, class: "tick" },
    minutes >= 1 ? `−${minutes} min` : `−${Math.round(t1 - t0)} s`));
  root.append(svg("text", { x: pad.l + w, y: height - 4, class: "tick", "text-anchor": "end" }, "now"));
  for (const s of SERIES) {
    const points = samples.filter((p) => p[s.key] !== null && p[s.key] !== undefined)
      .map((p) => `${x(p.t).toFixed(1)},${(pad.t + hgt - (p[s.key] / max[s.axis]) * hgt).toFixed(1)}`);
    if (points.length > 1) root.append(svg("polyline", { points: points.join(" "), class: `line ${s.cls}` }));
  }
  return root;
}

export function legend() {
  const el = document.createElement("ul");
  el.className = "legend";
  for (const s of SERIES) {
    const li = document.createElement("li");
    li.className = s.cls;
    li.textContent = s.label + (s.axis === "left" ? " (left)" : " (right)");
    el.append(li);
  }
  return el;
}

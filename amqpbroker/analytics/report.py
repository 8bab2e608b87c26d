"""report.html, summary.json, redrive.jsonl and the terminal summary, from small results.

Everything here works on plain Python values the job has already collected (per-queue
and per-window aggregates, never events), so it has no Spark in it and the plots are
inline SVG drawn here: the report is one self-contained file with no plotting library.
"""

from __future__ import annotations

import datetime
import html
import json
import math
import shlex
import shutil
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from amqpbroker.analytics.tables import TriageSettings

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
REDRIVE_SAMPLE = 50  # redrive lines shown in report.html (all are in redrive.jsonl)
PER_QUEUE_DIR = "redrive"  # in --out: redrive/<DLQ, URL-quoted>.jsonl
QUEUE_KEYS = ("enqueued", "dispatched", "acked", "returned", "dead_lettered", "expired", "killed")


@dataclass(frozen=True)
class OpenFile:
    """A `.part` event file: the broker is still writing it (or crashed while it did).
    Never analyzed (B-170); reported, since it holds the incident in progress."""

    name: str
    size: int
    modified_ms: int
    lines: int

    @staticmethod
    def of(path: Path) -> OpenFile:
        stat = path.stat()
        with path.open("rb") as f:
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        return OpenFile(path.name, stat.st_size, stat.st_mtime_ns // 1_000_000, lines)


@dataclass(frozen=True)
class BrokerRun:
    """One run of the broker (a start to a stop) as its event files show it: `seq`
    starts again at 1 with every run (B-170); `missing` events are `seq` gaps (events
    the broker dropped, or files deleted before they were analyzed)."""

    broker: str | None
    first_seq: int
    last_seq: int
    events: int
    first_ts: int | None
    last_ts: int | None
    files: int

    @property
    def missing(self) -> int:
        return max(0, self.last_seq - self.first_seq + 1 - self.events)


def broker_runs(files: Sequence[dict[str, Any]]) -> list[BrokerRun]:
    """The runs in per-file rows (ingest.overview), in time order: a file whose first
    `seq` is 1, or not after the last one's, starts a new run (issue 22 item 2)."""
    runs: list[BrokerRun] = []
    ordered = sorted(
        (f for f in files if f.get("first_seq") is not None),
        key=lambda f: (f["broker"] or "", f["first_ts"] or 0, f["file"] or ""),
    )
    for f in ordered:
        last = runs[-1] if runs else None
        new = (
            last is None
            or last.broker != f["broker"]
            or f["first_seq"] == 1
            or f["first_seq"] <= last.last_seq
        )
        if new:
            runs.append(
                BrokerRun(
                    f["broker"],
                    int(f["first_seq"]),
                    int(f["last_seq"]),
                    int(f["events"]),
                    f["first_ts"],
                    f["last_ts"],
                    1,
                )
            )
        else:
            assert last is not None
            runs[-1] = BrokerRun(
                last.broker,
                last.first_seq,
                int(f["last_seq"]),
                last.events + int(f["events"]),
                last.first_ts,
                f["last_ts"],
                last.files + 1,
            )
    return runs


def last_starts(files: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Broker -> the start (first ts) of its last run, for brokers that restarted."""
    seen: dict[str, list[BrokerRun]] = {}
    for r in broker_runs(files):
        if r.broker is not None and r.first_ts is not None:
            seen.setdefault(r.broker, []).append(r)
    return {b: int(runs[-1].first_ts or 0) for b, runs in seen.items() if len(runs) > 1}


@dataclass
class Results:
    """What the job collected for the report (lists of plain dicts, rows of the tables)."""

    events: int
    malformed_lines: int
    first_ts: int | None
    last_ts: int | None
    new_lines: int
    window_ms: int
    queue_totals: list[dict[str, Any]]
    queue_windows: list[dict[str, Any]]
    outcomes: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    time_to_dead_letter: list[dict[str, Any]]
    histogram: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    poison: list[dict[str, Any]]
    redrive_count: int
    redrive_sample: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    outages: list[dict[str, Any]] = field(default_factory=list)
    queue_failures: list[dict[str, Any]] = field(default_factory=list)
    redrive_groups: list[dict[str, Any]] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    open_files: list[OpenFile] = field(default_factory=list)
    failures: int = 0
    hashed_failures: int = 0
    settings: TriageSettings = field(default_factory=TriageSettings)
    events_dir: str = "EVENTS"
    out_dir: str = "OUT"

    @property
    def runs(self) -> list[BrokerRun]:
        return broker_runs(self.files)

    def warnings(self) -> list[str]:
        """What the operator must know before trusting the lists (items 2, 3, 6)."""
        found: list[str] = []
        if self.failures and not self.hashed_failures:
            found.append(
                f"POISON DETECTION HAD NOTHING TO WORK ON: none of the {self.failures:,} "
                "failures carries a body_hash (event-log.body-hash is false on the broker); "
                "only amqp_message_id was compared, and dead letters of an outage are held "
                "back instead of listed"
            )
        elif self.hashed_failures < self.failures:
            found.append(
                f"poison detection saw a body_hash on {self.hashed_failures:,} of "
                f"{self.failures:,} failures only"
            )
        held = self.held_back()
        if held.get("payload-not-checked"):
            found.append(
                f"{held['payload-not-checked']:,} outage dead letter(s) held back: their "
                "payload was not checked for poison (no body_hash)"
            )
        for f in self.open_files:
            found.append(
                f"NOT ANALYZED: {f.name} is still being written ({f.lines:,} lines, "
                f"{f.size:,} bytes, last written {_iso(f.modified_ms)}): the events since "
                "its start, the incident in progress, are not in this report"
            )
        runs = self.runs
        if len(runs) > 1:
            starts = ", ".join(_iso(r.first_ts) for r in runs[1:])
            found.append(f"the broker restarted {len(runs) - 1} time(s) (at {starts})")
        missing = sum(r.missing for r in runs)
        if missing:
            found.append(
                f"{missing:,} event(s) missing (seq gaps: dropped by the broker, B-170, or "
                "files deleted before analysis): counts are low by that much"
            )
        if self.malformed_lines:
            found.append(f"{self.malformed_lines:,} malformed line(s) skipped")
        return found

    def held_back(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for g in self.redrive_groups:
            if g["basis"] is not None and g["held_back"] is not None:
                held[g["held_back"]] = held.get(g["held_back"], 0) + int(g["messages"])
        return held

    def dead_lettered_by_reason(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for row in self.outcomes:
            if row["event"] == "dead-lettered":
                reason = row["reason"] or "unknown"
                totals[reason] = totals.get(reason, 0) + int(row["events"])
        return dict(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))

    def top_error_conditions(self, top: int = 10) -> list[list[Any]]:
        totals: dict[str, int] = {}
        for row in self.errors:
            condition = row["error_condition"]
            totals[condition] = totals.get(condition, 0) + int(row["failures"])
        ranked = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        return [[condition, count] for condition, count in ranked]


def summary(results: Results) -> dict[str, Any]:
    """summary.json, exactly the CONTRACT keys."""
    return {
        "events": results.events,
        "malformed_lines": results.malformed_lines,
        "first_ts": results.first_ts,
        "last_ts": results.last_ts,
        "queues": {
            row["queue"]: {"address": row["address"], **{k: int(row[k]) for k in QUEUE_KEYS}}
            for row in sorted(results.queue_totals, key=lambda r: r["queue"])
        },
        "dead_lettered_by_reason": results.dead_lettered_by_reason(),
        "top_error_conditions": results.top_error_conditions(),
        "poison_candidates": len(results.poison),
        "redrive_candidates": results.redrive_count,
    }


def write_redrive(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """redrive.jsonl: what `amqpbroker retry DLQ --ids FILE` reads (msg_id per line); the
    broker checks `queue`, `original_*` and `amqp_message_id` against the message the id
    names when retried (issue 16 item 2). One line per dead letter: `queue` is the queue
    to drain, `also_in` the other queues holding the same copy (issue 22 item 4); msg_id
    is never reused across restarts (issue 16), `original_msg_id` and `dead_lettered_ts`
    say which message and when (item 2)."""
    keys = (
        "msg_id",
        "queue",
        "original_address",
        "original_queue",
        "reason",
        "error_condition",
        "amqp_message_id",
        "basis",
        "also_in",
        "original_msg_id",
        "dead_lettered_ts",
    )
    count = 0
    per_queue = path.parent / PER_QUEUE_DIR  # the lines of one DLQ each: what its retry takes
    if per_queue.exists():
        shutil.rmtree(per_queue)
    per_queue.mkdir()
    files: dict[str, TextIO] = {}
    try:
        with path.open("w", encoding="utf-8") as out:
            for row in rows:
                line = json.dumps({k: row[k] for k in keys}) + "\n"
                out.write(line)
                queue = str(row["queue"])
                if queue not in files:
                    files[queue] = queue_list(path.parent, queue).open("w", encoding="utf-8")
                files[queue].write(line)
                count += 1
    finally:
        for f in files.values():
            f.close()
    return count


def queue_list(out: Path | str, queue: str) -> Path:
    """The redrive lines naming `queue`: `retry QUEUE --ids` on the whole list would
    report every other DLQ's line as skipped."""
    return Path(out) / PER_QUEUE_DIR / (urllib.parse.quote(queue, safe="") + ".jsonl")


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def terminal_summary(results: Results, out: Path) -> str:
    """The one-screen summary printed at the end of a run."""
    lines = [
        f"amqpbroker analyze: {results.events:,} events "
        f"({results.new_lines:,} new lines this run, {results.malformed_lines:,} malformed) "
        f"from {_iso(results.first_ts)} to {_iso(results.last_ts)} in {results.seconds:.1f} s",
        "",
        f"{'QUEUE':<28} {'ENQUEUED':>10} {'ACKED':>10} {'RETURNED':>9} {'DLQ':>8} "
        f"{'EXPIRED':>8} {'FAIL%':>6}",
    ]
    ranked = sorted(results.queue_totals, key=lambda r: (-int(r["failed"]), r["queue"]))
    for row in ranked[:10]:
        lines.append(
            f"{row['queue'][:28]:<28} {row['enqueued']:>10,} {row['acked']:>10,} "
            f"{row['returned']:>9,} {row['dead_lettered']:>8,} {row['expired']:>8,} "
            f"{_pct(row['failure_rate']):>6}"
        )
    if len(ranked) > 10:
        lines.append(f"... and {len(ranked) - 10} more queues (summary.json has all)")
    reasons = ", ".join(f"{k} {v:,}" for k, v in results.dead_lettered_by_reason().items())
    lines.append("")
    lines.append(f"dead-lettered by reason: {reasons or 'none'}")
    errors = ", ".join(f"{c} {n:,}" for c, n in results.top_error_conditions(3))
    lines.append(f"top error conditions:    {errors or 'none'}")
    lines.append(f"poison candidates:       {len(results.poison):,}")
    lines.append(f"redrive candidates:      {results.redrive_count:,}")
    for o in results.outages:
        lines.append(
            f"outage: {o['queue']} {_iso(o['start_ms'])} .. {_iso(o['end_ms'])}: "
            f"{o['failures']:,} failures, {_pct(o['failure_rate'])} "
            f"({'ended ' + _iso(o['ended_ms']) if o['ended_ms'] else 'NOT ENDED'})"
        )
    for g in results.redrive_groups:
        if g["basis"] is not None and g["held_back"] is None:
            lines.append(
                f"redrive {g['messages']:,} from {g['queue']} ({g['basis']}): "
                f"{retry_command(g['queue'], out)}"
            )
    for key, count in results.held_back().items():
        lines.append(f"held back ({key}): {count:,}")
    warnings = results.warnings()
    if warnings:
        lines.append("")
        lines.extend(f"WARNING: {w}" for w in warnings)
    lines.append("")
    lines.append(f"report:  {out / 'report.html'}")
    lines.append(f"redrive: {out / 'redrive.jsonl'}  (amqpbroker retry DLQ --ids FILE)")
    return "\n".join(lines)


def retry_command(queue: str, out: Path | str) -> str:
    """The ready-to-run retry of one DLQ's lines."""
    return shlex.join(["amqpbroker", "retry", queue, "--ids", str(queue_list(out, queue))])


def messages_command(addresses: Sequence[str], amqp_message_id: str | None) -> str:
    """`amqpbroker messages` showing a payload's dead letters (in the per-address DLQ of
    the shipped config) by an example message id (AMQUserID, B-132)."""
    dlq = "DLQ." + next((a for a in addresses if a), "ADDRESS")
    if amqp_message_id is None:
        return shlex.join(["amqpbroker", "messages", dlq])
    user_id = amqp_message_id if amqp_message_id.startswith("ID:") else "ID:" + amqp_message_id
    selector = "AMQUserID = '" + user_id.replace("'", "''") + "'"
    # Double quotes read better around a selector's quotes, when nothing in it expands.
    quoted = f'"{selector}"' if not set(selector) & set('"$`\\!') else shlex.quote(selector)
    return f"{shlex.join(['amqpbroker', 'messages', dlq])} --filter {quoted}"


# -- SVG plots -----------------------------------------------------------------------
_W, _H = 760, 280
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 40, 60, 30  # margins: tick labels, legend rows


def _y(fraction: float) -> float:
    return _H - _BOTTOM - (_H - _BOTTOM - _TOP) * fraction


def _number(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if value >= 1e3:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}"


def _frame(
    y_ticks: Sequence[tuple[float, str]],
    y_label: str,
    x_ticks: Sequence[tuple[float, str]],
    legend: Sequence[tuple[str, str]],
) -> list[str]:
    """Axes, tick labels (y_ticks as fractions of the height), legend row on top."""
    parts = [
        f'<line x1="{_LEFT}" y1="{_y(0)}" x2="{_W - _RIGHT}" y2="{_y(0)}" stroke="#333"/>',
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_y(0)}" stroke="#333"/>',
        f'<text x="{_LEFT}" y="{_TOP - 8}" font-size="11">{html.escape(y_label)}</text>',
    ]
    for fraction, label in y_ticks:
        y = _y(fraction)
        parts.append(
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">'
            f"{html.escape(label)}</text>"
        )
        parts.append(
            f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_W - _RIGHT}" y2="{y:.1f}" stroke="#eee"/>'
        )
    for x, label in x_ticks:
        parts.append(
            f'<text x="{x:.1f}" y="{_H - _BOTTOM + 16}" font-size="10" text-anchor="middle">'
            f"{html.escape(label)}</text>"
        )
    x, y = float(_LEFT), 6.0  # legend rows above the plot, wrapped at the right edge
    for name, colour in legend:
        width = 24 + 7 * len(name)
        if x + width > _W - _RIGHT and x > _LEFT:
            x, y = float(_LEFT), y + 16
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="10" height="10" fill="{colour}"/>')
        parts.append(
            f'<text x="{x + 14:.1f}" y="{y + 9:.1f}" font-size="11">{html.escape(name)}</text>'
        )
        x += width
    return parts


def line_chart(series: dict[str, list[tuple[int, float]]], *, y_label: str, step_ms: int) -> str:
    """Failure rates over time (x: epoch ms, y: 0-100%), one colour per series; a line
    is broken where a queue has no window for more than one step (no data is not 0%)."""
    points = [p for values in series.values() for p in values]
    if not points:
        return "<p>(no data)</p>"
    x0 = min(x for x, _ in points)
    x1 = max(max(x for x, _ in points), x0 + 1)

    def sx(x: int) -> float:
        return _LEFT + (_W - _RIGHT - _LEFT) * (x - x0) / (x1 - x0)

    x_ticks = [(sx(x0 + (x1 - x0) * i // 4), _tick(x0 + (x1 - x0) * i // 4)) for i in range(5)]
    y_ticks = [(i / 4, f"{25 * i}%") for i in range(5)]
    names = list(series)
    legend = [(name, PALETTE[i % len(PALETTE)]) for i, name in enumerate(names)]
    parts = _frame(y_ticks, y_label + " (times UTC)", x_ticks, legend)
    for name, colour in legend:
        segment: list[tuple[int, float]] = []
        for x, y in [*sorted(series[name]), (-1, 0.0)]:
            if segment and (x < 0 or x - segment[-1][0] > step_ms):
                if len(segment) == 1:
                    sx0, sy0 = sx(segment[0][0]), _y(min(max(segment[0][1], 0.0), 1.0))
                    parts.append(f'<circle cx="{sx0:.1f}" cy="{sy0:.1f}" r="2" fill="{colour}"/>')
                else:
                    path = " ".join(
                        f"{sx(px):.1f},{_y(min(max(py, 0.0), 1.0)):.1f}" for px, py in segment
                    )
                    parts.append(
                        f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                        f'points="{path}"/>'
                    )
                segment = []
            segment.append((x, y))
    return _svg(parts)


def _tick(ms: int) -> str:
    """A time axis label: date and time, UTC (the axis title says so)."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M")


def bar_chart(bars: list[tuple[str, dict[str, float]]], *, y_label: str) -> str:
    """Grouped bars on a log scale (one group per label, one bar per key), so a few
    dead letters stay visible next to a million acks."""
    if not bars:
        return "<p>(no data)</p>"
    keys = sorted({k for _, values in bars for k in values})
    top = max(max(values.values(), default=0) for _, values in bars)
    decades = max(1, math.ceil(math.log10(max(top, 1) + 1)))

    def height(value: float) -> float:
        return math.log10(1 + value) / decades

    slot = (_W - _RIGHT - _LEFT) / len(bars)
    width = max(slot * 0.8 / len(keys), 1)
    step = max(1, len(bars) // 16)
    x_ticks = [
        (_LEFT + slot * (i + 0.5), label) for i, (label, _) in enumerate(bars) if i % step == 0
    ]
    y_ticks = [(d / decades, _number(10**d)) for d in range(decades + 1)]
    legend = [(key, PALETTE[k % len(PALETTE)]) for k, key in enumerate(keys)]
    parts = _frame(y_ticks, y_label + " (log scale)", x_ticks, legend)
    for i, (_, values) in enumerate(bars):
        left = _LEFT + slot * i + slot * 0.1
        for k, (key, colour) in enumerate(legend):
            value = values.get(key, 0)
            if value <= 0:
                continue
            y = _y(height(value))
            parts.append(
                f'<rect x="{left + width * k:.1f}" y="{y:.1f}" width="{width:.1f}" '
                f'height="{_y(0) - y:.1f}" fill="{colour}"><title>{html.escape(key)}: '
                f"{value:,.0f}</title></rect>"
            )
    return _svg(parts)


def _svg(parts: list[str]) -> str:
    body = "\n".join(parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" role="img" font-family="sans-serif">\n{body}\n</svg>'
    )


def _table(rows: list[dict[str, Any]], columns: Sequence[str], limit: int = 50) -> str:
    if not rows:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in rows[:limit]:
        cells = []
        for c in columns:
            value = row.get(c)
            if isinstance(value, float):
                text = f"{value:.4g}"
            elif isinstance(value, list):
                text = ", ".join(str(v) for v in value)
            else:
                text = "" if value is None else str(value)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = (
        f"<p>{len(rows) - limit} more rows in the Parquet table.</p>" if len(rows) > limit else ""
    )
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def failure_rate_series(results: Results, *, queues: int = 8) -> dict[str, list[tuple[int, float]]]:
    """Failure rate per window for the queues with the most failures."""
    worst = sorted(
        (r for r in results.queue_totals if int(r["failed"]) > 0),
        key=lambda r: (-int(r["failed"]), r["queue"]),
    )[:queues]
    names = [r["queue"] for r in worst]
    series: dict[str, list[tuple[int, float]]] = {name: [] for name in names}
    for row in results.queue_windows:
        if row["queue"] in series and row["failure_rate"] is not None:
            series[row["queue"]].append((int(row["window_start_ms"]), float(row["failure_rate"])))
    return series


def render_html(results: Results) -> str:
    """report.html: summary, three plots, the main tables; no external resources."""
    data = summary(results)
    attempts: dict[int, dict[str, float]] = {}
    for row in results.attempts:
        if row["attempts"] is None:
            continue
        bucket = attempts.setdefault(int(row["attempts"]), {})
        bucket[row["outcome"]] = bucket.get(row["outcome"], 0) + int(row["messages"])
    attempt_bars = [(str(n), attempts[n]) for n in sorted(attempts)]
    ttd_bars = histogram_bars(results.histogram)
    overview = [
        ("events", f"{results.events:,}"),
        ("malformed lines", f"{results.malformed_lines:,}"),
        ("from", _iso(results.first_ts)),
        ("to", _iso(results.last_ts)),
        ("window", _duration(results.window_ms)),
        ("poison candidates", f"{len(results.poison):,}"),
        ("redrive candidates", f"{results.redrive_count:,}"),
    ]
    reasons = [
        {"reason": k, "dead_lettered": v} for k, v in data["dead_lettered_by_reason"].items()
    ]
    warnings = results.warnings()
    sections = [
        "<h1>amqpbroker: dead-letter triage</h1>",
        _table([{k: v for k, v in overview}], [k for k, _ in overview]),
        *(
            ["<h2>Warnings</h2><ul>"]
            + [f'<li style="color:#b00"><b>{html.escape(w)}</b></li>' for w in warnings]
            + ["</ul>"]
            if warnings
            else []
        ),
        "<h2>What broke, where, since when</h2>",
        _table(
            _failure_rows(results),
            [
                "queue",
                "first failure",
                "last failure",
                "failures",
                "by (container / link: failures)",
            ],
            limit=200,
        ),
        "<h2>Detected outages (runs of failures)</h2>",
        _table(
            [
                {
                    "queue": o["queue"],
                    "start": _iso(o["start_ms"]),
                    "end": _iso(o["end_ms"]),
                    "failures": o["failures"],
                    "messages": o["messages"],
                    "acked meanwhile": o["acked"],
                    "failure rate": _pct(o["failure_rate"]),
                    "ended (next ack)": _iso(o["ended_ms"]) if o["ended_ms"] else "NOT ENDED",
                }
                for o in results.outages
            ],
            [
                "queue",
                "start",
                "end",
                "failures",
                "messages",
                "acked meanwhile",
                "failure rate",
                "ended (next ack)",
            ],
            limit=200,
        ),
        "<h2>Redrive groups (DLQ x basis)</h2>",
        _table(
            _group_rows(results),
            [
                "queue",
                "basis",
                "held back",
                "messages",
                "original addresses",
                "error conditions",
                "dead-lettered",
                "also in",
                "command",
            ],
            limit=200,
        ),
        "<h2>Broker runs</h2>",
        _table(
            [
                {
                    "broker": r.broker,
                    "from": _iso(r.first_ts),
                    "to": _iso(r.last_ts),
                    "seq": f"{r.first_seq}..{r.last_seq}",
                    "events": r.events,
                    "missing (seq gaps)": r.missing,
                    "files": r.files,
                }
                for r in results.runs
            ],
            ["broker", "from", "to", "seq", "events", "missing (seq gaps)", "files"],
        ),
        "<h2>Thresholds used</h2>",
        _table([_thresholds(results.settings)], list(_thresholds(results.settings))),
        "<h2>Failure rate over time (queues with most failures)</h2>",
        line_chart(failure_rate_series(results), y_label="failure rate", step_ms=results.window_ms),
        "<h2>Delivery attempts per message (acked or dead-lettered)</h2>",
        bar_chart(attempt_bars, y_label="messages"),
        "<h2>Time from first routing to dead-letter</h2>",
        bar_chart(ttd_bars, y_label="messages"),
        "<h2>Queues</h2>",
        _table(
            sorted(results.queue_totals, key=lambda r: (-int(r["failed"]), r["queue"])),
            ["queue", "address", "sent", *QUEUE_KEYS, "failed", "failure_rate"],
            limit=200,
        ),
        "<h2>Dead-lettered by reason</h2>",
        _table(reasons, ["reason", "dead_lettered"]),
        "<h2>Time to dead-letter (ms)</h2>",
        _table(
            results.time_to_dead_letter,
            ["queue", "dead_lettered", "p50_ms", "p90_ms", "p99_ms", "max_ms"],
        ),
        "<h2>Top error conditions per queue</h2>",
        _table(results.errors, ["queue", "error_condition", "error_description", "failures"]),
        "<h2>Poison candidates (never redriven)</h2>",
        _table(
            [
                {
                    **row,
                    "first seen": _iso(row["first_ts"]),
                    "last seen": _iso(row["last_ts"]),
                    "look at them": messages_command(
                        row.get("addresses") or [], row.get("example_amqp_message_id")
                    ),
                }
                for row in results.poison
            ],
            [
                "key_type",
                "key",
                "failures",
                "messages",
                "consumers",
                "queues",
                "example_amqp_message_id",
                "error_condition",
                "error_description",
                "first seen",
                "last seen",
                "look at them",
            ],
        ),
        f"<h2>Redrive candidates ({results.redrive_count:,}, first {REDRIVE_SAMPLE})</h2>",
        _table(
            results.redrive_sample,
            ["msg_id", "queue", "original_address", "original_queue", "reason", "basis"],
        ),
    ]
    style = (
        "body{font-family:sans-serif;margin:2em;color:#222}"
        "table{border-collapse:collapse;margin:0.5em 0}"
        "td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px;text-align:left}"
        "th{background:#f3f3f3}"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>amqpbroker analyze</title><style>{style}</style></head><body>\n"
        + "\n".join(sections)
        + "\n</body></html>\n"
    )


def _failure_rows(results: Results) -> list[dict[str, Any]]:
    rows = []
    for q in sorted(results.queue_failures, key=lambda r: (-int(r["failures"]), r["queue"])):
        who = "; ".join(
            f"{c['connection'] or '(broker)'} / {c['link'] or '-'}: {c['failures']:,}"
            for c in q["consumers"]
        )
        rows.append(
            {
                "queue": q["queue"],
                "first failure": _iso(q["first_failure_ms"]),
                "last failure": _iso(q["last_failure_ms"]),
                "failures": q["failures"],
                "by (container / link: failures)": who,
            }
        )
    return rows


def _group_rows(results: Results) -> list[dict[str, Any]]:
    rows = []
    for g in results.redrive_groups:
        listed = g["basis"] is not None and g["held_back"] is None
        rows.append(
            {
                "queue": g["queue"],
                "basis": g["basis"] or "(none: not transient)",
                "held back": g["held_back"] or "",
                "messages": g["messages"],
                "original addresses": g["original_addresses"],
                "error conditions": g["error_conditions"] or ["(none)"],
                "dead-lettered": f"{_iso(g['first_ms'])} .. {_iso(g['last_ms'])}",
                "also in": g["also_in"],
                "command": retry_command(g["queue"], results.out_dir) if listed else "",
            }
        )
    return rows


def _thresholds(settings: TriageSettings) -> dict[str, str]:
    return {
        "window": _duration(settings.window_ms),
        "outage gap": _duration(settings.outage_gap_ms),
        "outage min failures": str(settings.outage_min_failures),
        "outage failure rate": _pct(settings.outage_failure_rate),
        "poison min failures": str(settings.poison_min_failures),
        "poison min messages": str(settings.poison_min_messages),
        "transient conditions": ", ".join(settings.transient_conditions),
    }


def histogram_bars(histogram: list[dict[str, Any]]) -> list[tuple[str, dict[str, float]]]:
    """Power-of-two buckets [from, 2*from) as contiguous bars, empty ones included, each
    labelled with both bounds (item 7)."""
    counts = {int(r["from_ms"]): float(r["messages"]) for r in histogram}
    if not counts:
        return []
    bars = []
    low, top = min(counts), max(counts)
    while low <= top:
        start = "0 ms" if low == 1 else _duration(low)
        bars.append((f"{start}-{_duration(2 * low)}", {"dead-lettered": counts.get(low, 0.0)}))
        low *= 2
    return bars


def _duration(ms: int) -> str:
    if ms < 1_000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:g} s"
    if ms < 3_600_000:
        return f"{ms / 60_000:g} min"
    return f"{ms / 3_600_000:g} h"

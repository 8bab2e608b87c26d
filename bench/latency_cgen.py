"""Two copies of the shared harness's C generator for `bench/latency.sh` (issue 20), and
the report of the per-message latencies they dump.

    python3 bench/latency_cgen.py build SOURCE.c OUTDIR    # OUTDIR/amqp-cgen-{burst,paced}
    python3 bench/latency_cgen.py report OUTDIR            # OUTDIR/<broker>.<gen>.<rep>.lat

Both copies write every message's `seq latency_ns receive_ns` to the file named by
`$LAT_DUMP` when the consumer ends (the harness keeps only percentiles). `burst` is the
generator as shipped: its paced producer sets its first proactor timeout to 1 s, sends the
first message, and, once the broker has answered it within the 1 ms pace, sleeps until
that timeout, then sends the ~1,000 messages it owes at once (as much as the broker's
1,000 credit allows, B-021), each stamped as it goes out. `paced` sets the first timeout
to 1 ms, as every later one: the producer is paced from its first message. The shared
source is read, never changed; a patch that no longer applies is an error.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

# (what the shared source says, what the copy says instead)
DUMP_PATCHES = [
    (
        "int64_t *lat; long nlat;",
        "int64_t *lat; long nlat; int64_t *lseq, *lrecv;",
    ),
    (
        "else { a->seen[seq] = 1; a->unique++; a->lat[a->nlat++] = now - ts; }",
        "else { a->seen[seq] = 1; a->unique++; a->lseq[a->nlat] = seq; "
        "a->lrecv[a->nlat] = now; a->lat[a->nlat++] = now - ts; }",
    ),
    (
        '  if (a->send) {\n    printf("RESULT',
        '  if (!a->send && getenv("LAT_DUMP")) {\n'
        '    FILE *f = fopen(getenv("LAT_DUMP"), "w");\n'
        "    if (f) {\n"
        "      for (long i = 0; i < a->nlat; ++i)\n"
        '        fprintf(f, "%ld %lld %lld\\n", (long)a->lseq[i], (long long)a->lat[i],\n'
        "                (long long)a->lrecv[i]);\n"
        "      fclose(f);\n"
        "    }\n"
        "  }\n"
        '  if (a->send) {\n    printf("RESULT',
    ),
    (
        "a.lat = malloc(sizeof(int64_t) * (size_t)a.n);",
        "a.lat = malloc(sizeof(int64_t) * (size_t)a.n); "
        "a.lseq = malloc(sizeof(int64_t) * (size_t)a.n); "
        "a.lrecv = malloc(sizeof(int64_t) * (size_t)a.n);",
    ),
]
PACED_PATCH = (
    "  pn_proactor_set_timeout(a.proactor, 1000);\n  int running = 1;",
    "  pn_proactor_set_timeout(a.proactor, a.rate > 0 ? 1 : 1000);\n  int running = 1;",
)
# Messages counted as the start-up burst in the "without" columns: the ~1,000 sent at once
# and those sent while it drains.
BURST_MESSAGES = 1100


def _patched(source: str, patches: list[tuple[str, str]]) -> str:
    for old, new in patches:
        if source.count(old) != 1:
            raise SystemExit(f"latency_cgen: the generator changed, cannot patch: {old!r}")
        source = source.replace(old, new)
    return source


def build(source_path: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    source = source_path.read_text()
    for name, patches in (("burst", DUMP_PATCHES), ("paced", [*DUMP_PATCHES, PACED_PATCH])):
        c_file = out / f"amqp-cgen-{name}.c"
        c_file.write_text(_patched(source, patches))
        binary = out / f"amqp-cgen-{name}"
        cmd = ["gcc", "-O2", "-o", str(binary), str(c_file), "-lqpid-proton"]
        subprocess.run(cmd, check=True)


def _percentile(sorted_ms: list[float], p: float) -> float:
    """The generator's own rule (amqp-cgen.c PCT): the value at index int(p/100 * n)."""
    n = len(sorted_ms)
    return sorted_ms[min(int(p / 100 * n), n - 1)]


def _figures(latencies_ms: list[float]) -> tuple[float, float, float, float]:
    ordered = sorted(latencies_ms)
    return (
        _percentile(ordered, 50),
        _percentile(ordered, 99),
        _percentile(ordered, 99.9),
        ordered[-1],
    )


def _drain_ms(rows: list[list[str]]) -> float:
    """The burst's drain: from the consumer's receipt of message 1 (the burst's first) to
    that of message 999 (its last but the one a credit top-up lets through); the broker's
    throughput on a backlog, without the producer's own delay before its first write."""
    received = {int(r[0]): int(r[2]) for r in rows}
    if 1 not in received or 999 not in received:
        return float("nan")
    return (received[999] - received[1]) / 1e6


def report(out: Path) -> None:
    """Per broker and generator: the medians over the reps of p50/p99/p99.9/max, of all
    messages and of those after the first BURST_MESSAGES; then per generator, the median
    over the reps of amqpbroker's p99 over the C broker's in the same rep, and of each
    broker's drain of the burst (`_drain_ms`)."""
    runs: dict[tuple[str, str], list[tuple[tuple[float, ...], tuple[float, ...]]]] = {}
    p99: dict[tuple[str, str, str], float] = {}
    drain: dict[tuple[str, str], list[float]] = {}
    for path in sorted(out.glob("*.lat")):
        broker, gen, rep, _ = path.name.split(".")
        rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
        every = [int(r[1]) / 1e6 for r in rows]
        later = [int(r[1]) / 1e6 for r in rows if int(r[0]) >= BURST_MESSAGES]
        if not every or not later:
            continue
        figures = (_figures(every), _figures(later))
        runs.setdefault((broker, gen), []).append(figures)
        p99[broker, gen, rep] = figures[0][1]
        drain.setdefault((broker, gen), []).append(_drain_ms(rows))
    head = "p50 / p99 / p99.9 / max ms"
    print(
        f"{'broker':<12} {'generator':<9} {'reps':>4}  {'all: ' + head:<38} "
        f"without the first {BURST_MESSAGES}: {head}"
    )
    for (broker, gen), figures in sorted(runs.items()):
        cols = []
        for part in (0, 1):
            med = [statistics.median(f[part][i] for f in figures) for i in range(4)]
            cols.append(" / ".join(f"{v:.2f}" for v in med))
        print(f"{broker:<12} {gen:<9} {len(figures):>4}  {cols[0]:<38} {cols[1]}")
    for gen in sorted({g for _, g in runs}):
        ratios = [
            v / p99["cbroker", g, rep]
            for (b, g, rep), v in sorted(p99.items())
            if b == "amqpbroker" and g == gen and ("cbroker", g, rep) in p99
        ]
        ratio = f"{statistics.median(ratios):.2f}x" if ratios else "-"
        line = f"{gen}: amqpbroker p99 / C broker p99, median of the reps: {ratio}"
        if gen == "burst":
            line += "; drain " + ", ".join(
                f"{b} {statistics.median(drain[b, gen]):.2f} ms"
                for b in ("amqpbroker", "cbroker")
                if (b, gen) in drain
            )
        print(line)


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[0] == "build":
        build(Path(argv[1]), Path(argv[2]))
    elif len(argv) == 2 and argv[0] == "report":
        report(Path(argv[1]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])

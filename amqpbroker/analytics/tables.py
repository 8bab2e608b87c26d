"""Dead-letter triage tables: pure `DataFrame -> DataFrame` functions over the event log.

Input is the valid events (schema.EVENT_SCHEMA). Definitions, kept in one place because
the report, summary.json and the redrive list all depend on them:

* A *failure* is a delivery the consumer could not process: `returned` with reason
  `modified-failed` or `connection-lost` (B-043, B-054), or `dead-lettered` with reason
  `rejected`, `max-attempts` or `delivery-error` (B-046, B-070). `released`, plain
  `modified` and an orderly `link-closed` are not failures: the consumer gave the message
  back without trying it.
* failure_rate = failures / (acked + failures): the share of settled attempts that
  failed; null when nothing was settled.
* An *outage* (issue 22 item 5) is a run of failures on one queue: the failures whose
  sliding `window_ms` (centred on their second) holds at least `outage_min_failures`
  failures at a failure rate of at least `outage_failure_rate`, merged into one run while
  no more than `outage_gap_ms` apart (failure_runs), so a run starts at its first failure
  wherever window boundaries fall. Its failure rate counts the queue's acks between its
  first and last failure. It has *ended* when the queue acked a message after it.
* A *poison candidate* is a payload (body_hash) or an application message id
  (amqp_message_id) that failed at least `poison_min_failures` times on at least
  `poison_min_messages` broker messages, and was never acked on a queue where it failed
  within `window_ms` of its failures (a shared body like `{"op":"refresh"}` that an
  outage failed but that went through before and after is no poison). One message failing
  many times is not enough: an outage does that to every message; the same payload
  failing again as another message (a resend, or a redriven copy) marks the payload.
* A *redrive candidate* is a dead letter whose copy is still queued and whose failure was
  transient (issue 22 item 1): it was `rejected` with an error condition in
  `transient_conditions` (basis `transient-condition`), or it reached max-delivery-attempts
  without an error condition and every failure of the message fell in ended outages of
  its queue (basis `outage-window`; only with a body_hash: a payload that was not checked
  for poison is held back, item 3). An explicit non-transient rejection never qualifies,
  outage or not. Never a poison candidate. One line per dead letter (item 4): the copy
  goes to every queue of the dead-letter address (with the shipped config `DLA` and
  `DLQ.<address>`, the same copy id); the line names one queue to drain, preferring the
  per-address DLQ, and lists the others under `also_in`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

FAILED_RETURNS = ("modified-failed", "connection-lost")
FAILED_DEAD_LETTERS = ("rejected", "max-attempts", "delivery-error")
# Events after which a message is no longer in the queue (B-171); a presettled dispatch
# removes it too.
GONE_EVENTS = ("acked", "dead-lettered", "expired", "killed", "replaced", "moved")
DEFAULT_TRANSIENT_CONDITIONS = (
    "amqp:resource-limit-exceeded",
    "amqp:connection:forced",
    "amqp:link:detach-forced",
)
COUNTERS = (
    "sent",
    "enqueued",
    "dispatched",
    "acked",
    "returned",
    "dead_lettered",
    "expired",
    "killed",
    "failed",
)


@dataclass(frozen=True, kw_only=True)
class TriageSettings:
    """The tunable thresholds (command-line options of `amqpbroker analyze`)."""

    window_ms: int = 60_000
    transient_conditions: tuple[str, ...] = DEFAULT_TRANSIENT_CONDITIONS
    outage_min_failures: int = 10
    outage_failure_rate: float = 0.5
    outage_gap_ms: int = 60_000
    poison_min_failures: int = 3
    poison_min_messages: int = 2
    top_errors: int = 10


def is_failure() -> Column:
    """The failure predicate (module docstring)."""
    return ((F.col("event") == "returned") & F.col("reason").isin(*FAILED_RETURNS)) | (
        (F.col("event") == "dead-lettered") & F.col("reason").isin(*FAILED_DEAD_LETTERS)
    )


def _window_start(window_ms: int) -> Column:
    return F.timestamp_millis(F.col("ts") - F.col("ts") % F.lit(window_ms))


def _rate(failed: Column, acked: Column) -> Column:
    settled = failed + acked
    return F.when(settled > 0, failed / settled)


def event_counts(events: DataFrame, window_ms: int) -> DataFrame:
    """Events per queue, window, event, reason and (for acked and dead-lettered) final
    delivery count: the one scan of the log every counter and histogram comes from."""
    final = F.col("event").isin("acked", "dead-lettered")
    return (
        events.where(F.col("queue").isNotNull())
        .withColumn("window_start", _window_start(window_ms))
        .withColumn("attempts", F.when(final, F.col("delivery_count")))
        .groupBy("queue", "window_start", "event", "reason", "attempts")
        .agg(F.min("address").alias("address"), F.count(F.lit(1)).alias("events"))
    )


def queue_windows(counts: DataFrame) -> DataFrame:
    """Per queue and window: sent (enqueued by routing), enqueued, dispatched, acked,
    returned, dead_lettered, expired, killed, failed, failure_rate."""

    def total(condition: Column) -> Column:
        return F.sum(F.when(condition, F.col("events")).otherwise(0)).cast("long")

    event = F.col("event")
    return (
        counts.groupBy("queue", "window_start")
        .agg(
            F.min("address").alias("address"),
            total((event == "enqueued") & (F.col("reason") == "route")).alias("sent"),
            total(event == "enqueued").alias("enqueued"),
            total(event == "dispatched").alias("dispatched"),
            total(event == "acked").alias("acked"),
            total(event == "returned").alias("returned"),
            total(event == "dead-lettered").alias("dead_lettered"),
            total(event == "expired").alias("expired"),
            total(event == "killed").alias("killed"),
            total(is_failure()).alias("failed"),
        )
        .withColumn("failure_rate", _rate(F.col("failed"), F.col("acked")))
        .select("queue", "address", "window_start", *COUNTERS, "failure_rate")
    )


def queue_totals(windows: DataFrame) -> DataFrame:
    """queue_windows summed over all windows."""
    return (
        windows.groupBy("queue")
        .agg(F.min("address").alias("address"), *[F.sum(c).alias(c) for c in COUNTERS])
        .withColumn("failure_rate", _rate(F.col("failed"), F.col("acked")))
        .select("queue", "address", *COUNTERS, "failure_rate")
    )


def queue_outcomes(counts: DataFrame) -> DataFrame:
    """Returned by outcome, dead-lettered by reason, expired, killed and replaced (ring,
    last-value: B-120, B-121) by reason."""
    return (
        counts.where(
            F.col("event").isin("returned", "dead-lettered", "expired", "killed", "replaced")
        )
        .groupBy("queue", "address", "window_start", "event", "reason")
        .agg(F.sum("events").alias("events"))
    )


def attempt_distribution(counts: DataFrame) -> DataFrame:
    """Messages by the delivery count they ended with, acked or dead-lettered."""
    return (
        counts.where(F.col("event").isin("acked", "dead-lettered"))
        .groupBy("queue", F.col("event").alias("outcome"), "attempts")
        .agg(F.sum("events").alias("messages"))
    )


def triage_events(events: DataFrame) -> DataFrame:
    """The returned and dead-lettered events, every column failures() and dead_letters()
    need: one wide scan of the log instead of one per table (Parquet reads every
    selected column of every row; the filter keeps ~1 event in 50)."""
    return events.where(F.col("event").isin("returned", "dead-lettered")).select(
        "ts",
        "event",
        "broker",
        "durable",
        "msg_id",
        "queue",
        "address",
        "reason",
        "delivery_count",
        "connection",
        "link",
        "target_address",
        "target_queues",
        "copy_msg_id",
        "first_ts",
        "error_condition",
        "error_description",
        "amqp_message_id",
        "body_hash",
    )


def dead_letters(events: DataFrame) -> DataFrame:
    """The `dead-lettered` events with the time from first routing (first_ts, B-170)."""
    return events.where(F.col("event") == "dead-lettered").withColumn(
        "time_to_dead_letter_ms", F.col("ts") - F.col("first_ts")
    )


def time_to_dead_letter(dead: DataFrame) -> DataFrame:
    """Per queue: percentiles of first routing -> dead-letter, in ms."""
    q = F.percentile_approx("time_to_dead_letter_ms", [0.5, 0.9, 0.99], 10_000)
    return (
        dead.groupBy("queue")
        .agg(
            F.count(F.lit(1)).alias("dead_lettered"),
            q.alias("q"),
            F.max("time_to_dead_letter_ms").alias("max_ms"),
        )
        .select(
            "queue",
            "dead_lettered",
            F.col("q")[0].alias("p50_ms"),
            F.col("q")[1].alias("p90_ms"),
            F.col("q")[2].alias("p99_ms"),
            "max_ms",
        )
    )


def time_to_dead_letter_histogram(dead: DataFrame) -> DataFrame:
    """Dead-letters by power-of-two bucket of time-to-dead-letter (for the plot)."""
    bucket = F.floor(F.log2(F.greatest(F.col("time_to_dead_letter_ms"), F.lit(1)))).cast("int")
    return (
        dead.groupBy(F.pow(F.lit(2), bucket).cast("long").alias("from_ms"))
        .agg(F.count(F.lit(1)).alias("messages"))
        .orderBy("from_ms")
    )


def failures(events: DataFrame) -> DataFrame:
    """The failure events (module docstring), with the columns triage needs."""
    return events.where(is_failure()).select(
        "ts",
        "event",
        "msg_id",
        "queue",
        "address",
        "reason",
        "connection",
        "link",
        "error_condition",
        "error_description",
        "amqp_message_id",
        "body_hash",
    )


def error_counts(failed: DataFrame) -> DataFrame:
    """Failures by queue, error condition and description (conditions only)."""
    return (
        failed.where(F.col("error_condition").isNotNull())
        .groupBy("queue", "error_condition", "error_description")
        .agg(F.count(F.lit(1)).alias("failures"))
    )


def top_errors(errors: DataFrame, top: int) -> DataFrame:
    """The `top` most frequent condition/description pairs of each queue."""
    order = Window.partitionBy("queue").orderBy(
        F.desc("failures"), "error_condition", "error_description"
    )
    return errors.withColumn("rank", F.row_number().over(order)).where(F.col("rank") <= top)


def acks(events: DataFrame) -> DataFrame:
    """The `acked` events on a queue, with the columns outages and poison read (they take
    this or the whole log alike)."""
    return events.where((F.col("event") == "acked") & F.col("queue").isNotNull()).select(
        "event", "queue", "ts", "body_hash", "amqp_message_id"
    )


def poison_suspects(failed: DataFrame, settings: TriageSettings) -> DataFrame:
    """Payloads and application message ids that fail across messages (`key_type`, `key`
    and what the report shows), before poison_candidates drops those that went through."""
    last_error = F.max(
        F.when(
            F.col("error_condition").isNotNull(),
            F.struct("ts", "error_condition", "error_description"),
        )
    )

    def by(key: str) -> DataFrame:
        return (
            failed.where(F.col(key).isNotNull())
            .groupBy(F.col(key).alias("key"))
            .agg(
                F.count(F.lit(1)).alias("failures"),
                F.countDistinct("msg_id").alias("messages"),
                F.countDistinct("connection").alias("consumers"),
                F.array_sort(F.collect_set("queue")).alias("queues"),
                F.array_sort(F.collect_set("address")).alias("addresses"),
                F.min("ts").alias("first_ts"),
                F.max("ts").alias("last_ts"),
                F.min(F.struct("ts", "amqp_message_id")).alias("first"),
                last_error.alias("last_error"),
            )
            .select(
                F.lit(key).alias("key_type"),
                "key",
                "failures",
                "messages",
                "consumers",
                "queues",
                "addresses",
                "first_ts",
                "last_ts",
                F.col("first.amqp_message_id").alias("example_amqp_message_id"),
                F.col("last_error.error_condition").alias("error_condition"),
                F.col("last_error.error_description").alias("error_description"),
            )
            .where(
                (F.col("failures") >= settings.poison_min_failures)
                & (F.col("messages") >= settings.poison_min_messages)
            )
        )

    return by("body_hash").unionByName(by("amqp_message_id"))


def poison_candidates(
    failed: DataFrame,
    events: DataFrame,
    settings: TriageSettings,
    suspects: DataFrame | None = None,
) -> DataFrame:
    """Payloads and application message ids that fail across messages and did not go
    through where they failed meanwhile (module docstring). With an example
    amqp_message_id, the last error condition and description, for the report. `events`
    needs only the acks of the suspects' keys (state.acks_of_keys); `suspects` is
    poison_suspects(failed, settings), when the caller has it (cached)."""
    if suspects is None:
        suspects = poison_suspects(failed, settings)

    def went_through(candidates: DataFrame, key: str) -> DataFrame:
        spans = F.broadcast(
            candidates.select(
                F.col("key").alias(key),
                "key_type",
                "queues",
                (F.col("first_ts") - settings.window_ms).alias("from_ts"),
                (F.col("last_ts") + settings.window_ms).alias("to_ts"),
            )
        )
        acked = events.where((F.col("event") == "acked") & F.col(key).isNotNull())
        return (
            acked.select(key, "queue", "ts")
            .join(spans, key)
            .where(
                F.col("ts").between(F.col("from_ts"), F.col("to_ts"))
                & F.array_contains(F.col("queues"), F.col("queue"))
            )
            .select("key_type", F.col(key).alias("key"))
            .distinct()
        )

    results = []
    for key in ("body_hash", "amqp_message_id"):
        candidates = suspects.where(F.col("key_type") == key)
        results.append(
            candidates.join(went_through(candidates, key), ["key_type", "key"], "left_anti")
        )
    return results[0].unionByName(results[1])


def ack_seconds(events: DataFrame) -> DataFrame:
    """Acks per queue and second (`sec`), with the first and last ack's ts: what outage
    detection needs of the acks (additive, so kept incrementally: analytics/state.py)."""
    return (
        events.where((F.col("event") == "acked") & F.col("queue").isNotNull())
        .groupBy("queue", F.floor(F.col("ts") / 1000).alias("sec"))
        .agg(
            F.count(F.lit(1)).alias("acks"),
            F.min("ts").alias("min_ts"),
            F.max("ts").alias("max_ts"),
        )
    )


def failure_runs(failed: DataFrame, acked: DataFrame, settings: TriageSettings) -> DataFrame:
    """The failures with `run`: the number of their outage run on the queue, or null.
    `acked` is ack_seconds().

    Sliding windows, merged (issue 22 item 5): per queue and second, the failures and
    acks in the `window_ms` centred on it; a second with failures is *hot* when that
    window has at least `outage_min_failures` failures at a rate of at least
    `outage_failure_rate`. Hot seconds no more than `outage_gap_ms` apart form one run.
    So a run starts at its first failure wherever window boundaries fall, and sporadic
    failures (never hot) do not chain into one long diluted run."""
    half = max(1, settings.window_ms // 2000)
    gap = max(1, settings.outage_gap_ms // 1000)
    second = F.floor(F.col("ts") / 1000).alias("sec")
    failed = failed.where(F.col("queue").isNotNull()).withColumn("sec", second)
    per_failed = failed.groupBy("queue", "sec").agg(F.count(F.lit(1)).alias("f"))
    per_acked = acked.select("queue", "sec", F.col("acks").alias("a"))
    around = Window.partitionBy("queue").orderBy("sec").rangeBetween(-half, half)
    seconds = (
        per_failed.join(per_acked, ["queue", "sec"], "full")
        .fillna(0, ["f", "a"])
        .withColumn("wf", F.sum("f").over(around))
        .withColumn("wa", F.sum("a").over(around))
    )
    hot = seconds.where(
        (F.col("f") > 0)
        & (F.col("wf") >= settings.outage_min_failures)
        & (F.col("wf") / (F.col("wf") + F.col("wa")) >= settings.outage_failure_rate)
    ).select("queue", "sec")
    order = Window.partitionBy("queue").orderBy("sec")
    previous = F.lag("sec").over(order)
    starts = (previous.isNull() | (F.col("sec") - previous > gap)).cast("long")
    runs = hot.withColumn("_starts", starts).withColumn(
        "run",
        F.sum("_starts").over(order.rowsBetween(Window.unboundedPreceding, Window.currentRow)),
    )
    return failed.join(runs.select("queue", "sec", "run"), ["queue", "sec"], "left").drop("sec")


def outage_candidates(runs: DataFrame, settings: TriageSettings) -> DataFrame:
    """The runs with at least `outage_min_failures` failures: queue, run, address,
    start_ms, end_ms, failures, messages."""
    return (
        runs.where(F.col("run").isNotNull())
        .groupBy("queue", "run")
        .agg(
            F.min("address").alias("address"),
            F.min("ts").alias("start_ms"),
            F.max("ts").alias("end_ms"),
            F.count(F.lit(1)).alias("failures"),
            F.countDistinct("msg_id").alias("messages"),
        )
        .where(F.col("failures") >= settings.outage_min_failures)
    )


def outages(runs: DataFrame, events: DataFrame, settings: TriageSettings) -> DataFrame:
    """The runs of failures with at least `outage_min_failures` failures: queue, run,
    start_ms, end_ms, failures, messages, acked (between start and end), failure_rate,
    failing (rate at or over the threshold) and ended_ms (the queue's next ack, or null)."""
    candidates = outage_candidates(runs, settings).cache()
    acks = events.where((F.col("event") == "acked") & F.col("queue").isNotNull()).select(
        F.col("queue").alias("q"), F.col("ts")
    )
    spans = F.broadcast(candidates.select("queue", "run", "start_ms", "end_ms"))
    # Acks inside a run (bounded by the run), and the first ack after it: only the acks
    # up to the next run's end are looked at, so the join stays the size of the runs.
    inside = (
        acks.join(
            spans,
            (F.col("q") == F.col("queue"))
            & F.col("ts").between(F.col("start_ms"), F.col("end_ms")),
        )
        .groupBy("queue", "run")
        .agg(F.count(F.lit(1)).alias("acked"))
    )
    after = (
        acks.join(F.broadcast(candidates.select("queue", "end_ms")), F.col("q") == F.col("queue"))
        .where(F.col("ts") > F.col("end_ms"))
        .groupBy("queue", "end_ms")
        .agg(F.min("ts").alias("ended_ms"))
    )
    rate = F.col("failures") / (F.col("failures") + F.col("acked"))
    return (
        candidates.join(inside, ["queue", "run"], "left")
        .join(after, ["queue", "end_ms"], "left")
        .withColumn("acked", F.coalesce(F.col("acked"), F.lit(0)).cast("long"))
        .withColumn("failure_rate", rate)
        .withColumn("failing", F.col("failure_rate") >= settings.outage_failure_rate)
        .select(
            "queue",
            "address",
            "run",
            "start_ms",
            "end_ms",
            "failures",
            "messages",
            "acked",
            "failure_rate",
            "failing",
            "ended_ms",
        )
    )


def outage_messages(runs: DataFrame, outages: DataFrame) -> DataFrame:
    """(msg_id, queue) whose every failure on the queue fell in failing outages that have
    ended."""
    over = outages.where(F.col("failing") & F.col("ended_ms").isNotNull()).select(
        "queue", "run", F.lit(1).alias("over")
    )
    return (
        runs.join(F.broadcast(over), ["queue", "run"], "left")
        .groupBy("msg_id", "queue")
        .agg(F.min(F.coalesce(F.col("over"), F.lit(0))).alias("all_over"))
        .where(F.col("all_over") == 1)
        .select("msg_id", "queue")
    )


def still_queued_copies(
    dead: DataFrame, events: DataFrame, last_start: dict[str, int] | None = None
) -> DataFrame:
    """One row per dead letter whose copy is still queued somewhere (B-171: no later
    event removed it there): `queue`, the one to drain (the per-address DLQ rather than
    the dead-letter address's own queue), and `also_in`, the other queues that hold the
    same copy (module docstring, issue 22 item 4).

    `last_start` maps a broker to the start of its last run (issue 22 item 2): a
    non-durable copy dead-lettered before it did not survive the restart."""
    lost = F.lit(False)
    if last_start:
        start = F.create_map(*[F.lit(x) for kv in sorted(last_start.items()) for x in kv])
        lost = ~F.coalesce(F.col("durable"), F.lit(False)) & (
            F.col("ts") < F.coalesce(F.try_element_at(start, F.col("broker")), F.lit(0))
        )
    copies = dead.where(F.col("copy_msg_id").isNotNull() & ~lost).select(
        F.col("msg_id").alias("original_msg_id"),
        F.col("copy_msg_id").alias("msg_id"),
        F.explode("target_queues").alias("dlq"),
        F.col("queue").alias("original_queue"),
        F.col("address").alias("original_address"),
        "target_address",
        "reason",
        "error_condition",
        "error_description",
        "body_hash",
        "amqp_message_id",
        "connection",
        "link",
        F.col("ts").alias("dead_lettered_ts"),
    )
    # Narrow the removals to the copies first: a semi join can broadcast the (small)
    # copies, the anti join below could only broadcast the (large) removals.
    keys = F.broadcast(copies.select("msg_id", "dlq"))
    gone = (
        events.where(
            F.col("event").isin(*GONE_EVENTS)
            | ((F.col("event") == "dispatched") & (F.col("reason") == "presettled"))
        )
        .select("msg_id", F.col("queue").alias("dlq"))
        .join(keys, ["msg_id", "dlq"], "left_semi")
    )
    held = copies.join(gone, ["msg_id", "dlq"], "left_anti")
    rest = [c for c in held.columns if c not in ("msg_id", "dlq")]
    queues = F.array_sort(F.collect_set("dlq"))
    grouped = held.groupBy("msg_id").agg(
        queues.alias("queues"), *[F.first(c, ignorenulls=True).alias(c) for c in rest]
    )
    own = F.filter("queues", lambda q: q != F.coalesce(F.col("target_address"), F.lit("")))
    drain = F.coalesce(F.try_element_at(own, F.lit(1)), F.try_element_at(F.col("queues"), F.lit(1)))
    return (
        grouped.withColumn("dlq", drain)
        .withColumn("also_in", F.array_remove("queues", F.col("dlq")))
        .drop("queues")
    )


def classify_dead_letters(
    copies: DataFrame, outage_msgs: DataFrame, poison: DataFrame, settings: TriageSettings
) -> DataFrame:
    """Every still-queued dead letter with `basis` (why it may be redriven, or null) and
    `held_back` (why a dead letter with a basis is not listed: `poison` or
    `payload-not-checked`, or null): the redrive list is basis set and held_back null."""
    outage = outage_msgs.select(
        F.col("msg_id").alias("original_msg_id"),
        F.col("queue").alias("original_queue"),
        F.lit(True).alias("in_outage"),
    )
    poison_keys = poison.select("key_type", "key")
    body_poison = poison_keys.where(F.col("key_type") == "body_hash").select(
        F.col("key").alias("body_hash"), F.lit(True).alias("poison_body")
    )
    id_poison = poison_keys.where(F.col("key_type") == "amqp_message_id").select(
        F.col("key").alias("amqp_message_id"), F.lit(True).alias("poison_id")
    )
    transient = (F.col("reason") == "rejected") & F.col("error_condition").isin(
        *settings.transient_conditions
    )
    outage_basis = (
        (F.col("reason") == "max-attempts")
        & F.col("error_condition").isNull()
        & F.coalesce(F.col("in_outage"), F.lit(False))
    )
    basis = F.when(transient, "transient-condition").when(outage_basis, "outage-window")
    held_back = (
        F.when(F.col("basis").isNull(), None)
        .when(F.col("poison_body") | F.col("poison_id"), "poison")
        .when(
            (F.col("basis") == "outage-window") & F.col("body_hash").isNull(), "payload-not-checked"
        )
    )
    return (
        copies.join(F.broadcast(outage), ["original_msg_id", "original_queue"], "left")
        .join(F.broadcast(body_poison), "body_hash", "left")
        .join(F.broadcast(id_poison), "amqp_message_id", "left")
        .withColumn("poison_body", F.coalesce(F.col("poison_body"), F.lit(False)))
        .withColumn("poison_id", F.coalesce(F.col("poison_id"), F.lit(False)))
        .withColumn("basis", basis)
        .withColumn("held_back", held_back)
        .select(
            "msg_id",
            F.col("dlq").alias("queue"),
            "also_in",
            "original_address",
            "original_queue",
            "reason",
            "error_condition",
            "error_description",
            "basis",
            "held_back",
            "original_msg_id",
            "dead_lettered_ts",
            "amqp_message_id",
            "body_hash",
            "connection",
            "link",
        )
    )


def redrive_candidates(classified: DataFrame) -> DataFrame:
    """The redrive list: dead letters with a basis and nothing holding them back."""
    return classified.where(F.col("basis").isNotNull() & F.col("held_back").isNull()).drop(
        "held_back"
    )


def queue_failures(failed: DataFrame, events: DataFrame) -> DataFrame:
    """Per queue: first and last failure, and who failed or rejected (connection =
    container-id, link) with how many failures, most first (item 7). A dead letter of a
    reject or of max-delivery-attempts is the broker's event (no connection): the consumer
    is the one its last dispatch went to."""
    broker_side = failed.where(F.col("connection").isNull()).select("msg_id", "queue").distinct()
    last_dispatch = (
        events.where(F.col("event") == "dispatched")
        .select("msg_id", "queue", "ts", "connection", "link")
        .join(F.broadcast(broker_side), ["msg_id", "queue"], "left_semi")
        .groupBy("msg_id", "queue")
        .agg(F.max(F.struct("ts", "connection", "link")).alias("d"))
    )
    who = failed.join(last_dispatch, ["msg_id", "queue"], "left").select(
        "queue",
        "ts",
        F.coalesce(F.col("connection"), F.col("d.connection")).alias("connection"),
        F.when(F.col("connection").isNull(), F.col("d.link"))
        .otherwise(F.col("link"))
        .alias("link"),
    )
    by_consumer = who.groupBy("queue", "connection", "link").agg(
        F.count(F.lit(1)).alias("failures"),
        F.min("ts").alias("first_ms"),
        F.max("ts").alias("last_ms"),
    )
    return by_consumer.groupBy("queue").agg(
        F.min("first_ms").alias("first_failure_ms"),
        F.max("last_ms").alias("last_failure_ms"),
        F.sum("failures").alias("failures"),
        F.slice(
            F.sort_array(
                F.collect_list(
                    F.struct(
                        (-F.col("failures")).alias("rank"),
                        F.col("connection"),
                        F.col("link"),
                        F.col("failures"),
                    )
                )
            ),
            1,
            5,
        ).alias("consumers"),
    )

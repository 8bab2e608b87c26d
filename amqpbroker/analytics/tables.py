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
* A window is *failing* when it has at least `outage_min_failures` failures and a
  failure rate of at least `outage_failure_rate`; *healthy* when it has acks and a lower
  rate. An outage "has since ended" when a healthy window of the same queue follows.
* A *poison candidate* is a payload (body_hash) or an application message id
  (amqp_message_id) that failed at least `poison_min_failures` times on at least
  `poison_min_messages` broker messages. One message failing many times is not enough:
  an outage does that to every message; the same payload failing again as another
  message (a resend, or a redriven copy) is what marks the payload itself.
* A *redrive candidate* is a dead-letter copy still in its DLQ whose failure was
  transient: its error condition is in `transient_conditions`, or every failure of the
  message fell in failing windows of its queue that a healthy window followed. Never a
  poison candidate.
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
    """Returned by outcome, dead-lettered by reason, expired and killed by reason."""
    return (
        counts.where(F.col("event").isin("returned", "dead-lettered", "expired", "killed"))
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
        "msg_id",
        "queue",
        "address",
        "reason",
        "delivery_count",
        "connection",
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


def poison_candidates(failed: DataFrame, settings: TriageSettings) -> DataFrame:
    """Payloads and application message ids that fail across messages (docstring)."""

    def by(key: str) -> DataFrame:
        return (
            failed.where(F.col(key).isNotNull())
            .groupBy(F.col(key).alias("key"))
            .agg(
                F.count(F.lit(1)).alias("failures"),
                F.countDistinct("msg_id").alias("messages"),
                F.countDistinct("connection").alias("consumers"),
                F.array_sort(F.collect_set("queue")).alias("queues"),
                F.min("ts").alias("first_ts"),
                F.max("ts").alias("last_ts"),
            )
            .select(F.lit(key).alias("key_type"), "*")
        )

    return (
        by("body_hash")
        .unionByName(by("amqp_message_id"))
        .where(
            (F.col("failures") >= settings.poison_min_failures)
            & (F.col("messages") >= settings.poison_min_messages)
        )
    )


def outage_messages(failed: DataFrame, windows: DataFrame, settings: TriageSettings) -> DataFrame:
    """(msg_id, queue) whose every failure fell in failing windows of its queue that a
    healthy window of the same queue followed: the outage is over."""
    flagged = windows.select(
        "queue",
        "window_start",
        (
            (F.col("failed") >= settings.outage_min_failures)
            & (F.col("failure_rate") >= settings.outage_failure_rate)
        ).alias("failing"),
        ((F.col("acked") > 0) & (F.col("failure_rate") < settings.outage_failure_rate)).alias(
            "healthy"
        ),
    )
    last_healthy = (
        flagged.where("healthy").groupBy("queue").agg(F.max("window_start").alias("last_healthy"))
    )
    per_message = (
        failed.withColumn("window_start", _window_start(settings.window_ms))
        .join(flagged, ["queue", "window_start"])
        .groupBy("msg_id", "queue")
        .agg(
            F.min(F.col("failing").cast("int")).alias("all_failing"),
            F.max("window_start").alias("last_failure_window"),
        )
    )
    return (
        per_message.join(last_healthy, "queue")
        .where((F.col("all_failing") == 1) & (F.col("last_healthy") > F.col("last_failure_window")))
        .select("msg_id", "queue")
    )


def still_queued_copies(dead: DataFrame, events: DataFrame) -> DataFrame:
    """One row per dead-letter copy still in its DLQ: no later event removed it there."""
    copies = dead.where(F.col("copy_msg_id").isNotNull()).select(
        F.col("msg_id").alias("original_msg_id"),
        F.col("copy_msg_id").alias("msg_id"),
        F.explode("target_queues").alias("dlq"),
        F.col("queue").alias("original_queue"),
        F.col("address").alias("original_address"),
        "reason",
        "error_condition",
        "body_hash",
        "amqp_message_id",
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
    return copies.join(gone, ["msg_id", "dlq"], "left_anti")


def redrive_candidates(
    copies: DataFrame, outages: DataFrame, poison: DataFrame, settings: TriageSettings
) -> DataFrame:
    """Dead-letter copies to send back (module docstring); `msg_id` is the copy's id,
    `queue` the DLQ: what `amqpbroker retry DLQ --ids` takes."""
    outage = outages.select(
        F.col("msg_id").alias("original_msg_id"),
        F.col("queue").alias("original_queue"),
        F.lit(True).alias("in_outage"),
    )
    poison_keys = poison.select("key_type", "key")
    basis = F.when(
        F.col("error_condition").isin(*settings.transient_conditions), "transient-condition"
    ).when(F.col("in_outage"), "outage-window")
    body_poison = poison_keys.where(F.col("key_type") == "body_hash").select(
        F.col("key").alias("body_hash")
    )
    id_poison = poison_keys.where(F.col("key_type") == "amqp_message_id").select(
        F.col("key").alias("amqp_message_id")
    )
    return (
        copies.join(outage, ["original_msg_id", "original_queue"], "left")
        .withColumn("basis", basis)
        .where(F.col("basis").isNotNull())
        .join(body_poison, "body_hash", "left_anti")
        .join(id_poison, "amqp_message_id", "left_anti")
        .select(
            "msg_id",
            F.col("dlq").alias("queue"),
            "original_address",
            "original_queue",
            "reason",
            "error_condition",
            "basis",
            "original_msg_id",
            "dead_lettered_ts",
            "amqp_message_id",
        )
    )

"""Slow consumers: Artemis `slow-consumer-threshold` / `-policy` / `-check-period` (issue 19).

Theory of operation
-------------------
A consumer that attaches to a queue whose address-settings have `slow-consumer-threshold`
>= 0 enrols the queue: the broker's `tick()` checks it every `slow-consumer-check-period`
seconds (its next check is one more deadline in `next_deadline_ms`, so it needs no timer of
its own). A check measures each consumer's acknowledge rate since the previous check (or
since it attached): messages acknowledged per second. As Artemis `SlowConsumerReaperRunnable`
does, a consumer is slow when its queue holds at least `threshold` messages (and at least
one: a queue with too little to consume makes no consumer slow) and its rate is below
`threshold`. Browsers never acknowledge and are left out. Then, per `slow-consumer-policy`:

* NOTIFY: a WARN log line naming the queue, consumer, connection and rate, and
  `amqpbroker_slow_consumers_total{policy="NOTIFY"}` counts it (Artemis sends a
  CONSUMER_SLOW notification to its management notification address, which amqpbroker
  does not have: the counter is what users alert on);
* KILL: the same (`policy="KILL"`), and a `CloseConnection` effect: the shell closes the
  consumer's connection with `amqp:resource-limit-exceeded` through the connection's own
  error path, which returns the consumer's unacknowledged messages to the queue.

Settings added at runtime (B-162 `addAddressSettings`) enrol the queues that now ask for
checks (`slow_settings_changed`). A slow consumer is reported at every check while it stays
slow (as Artemis). A queue with
no consumer left, deleted, or no longer `threshold >= 0` leaves the schedule at its check.
"""

from __future__ import annotations

import heapq
import logging

from amqpbroker.core.effects import CloseConnection, Effect
from amqpbroker.core.parts import _BrokerPart
from amqpbroker.core.queue import Consumer, Queue
from amqpbroker.core.totals import BrokerStats

log = logging.getLogger("amqpbroker.core.broker")  # the broker's one logger

KILL_CONDITION = "amqp:resource-limit-exceeded"


class _SlowConsumers(_BrokerPart):
    """`Broker`'s slow-consumer checks (a mixin: it declares the broker state it uses,
    which `Broker.__init__` sets, `_slow_due` and `_slow_watched` included)."""

    _effects: list[Effect]
    _slow_due: list[tuple[int, str]]  # (next check ms, queue name): a heap
    _slow_watched: set[str]  # queue names with an entry in `_slow_due`
    stats: BrokerStats

    def watch_consumer(self, consumer: Consumer, now_ms: int) -> None:
        """A consumer attached: its rate is measured from now; its queue is checked every
        check period if its settings ask for it."""
        consumer.rate_mark = (consumer.acked, now_ms)
        self._enrol(consumer.queue, now_ms)

    def slow_settings_changed(self) -> None:
        """Address-settings changed at runtime (B-162 addAddressSettings): queues with
        consumers that now ask for checks are enrolled, their rates measured from now."""
        now_ms = self.now_ms
        for queue in self.queues.values():
            if queue.consumers and queue.name not in self._slow_watched:
                for consumer in queue.consumers:
                    consumer.rate_mark = (consumer.acked, now_ms)
                self._enrol(queue, now_ms)

    def _enrol(self, queue: Queue, now_ms: int) -> None:
        if queue.name in self._slow_watched:
            return
        settings = self.settings.resolve(queue.address)
        if settings.slow_consumer_threshold < 0:
            return
        self._slow_watched.add(queue.name)
        heapq.heappush(
            self._slow_due, (now_ms + settings.slow_consumer_check_period * 1000, queue.name)
        )

    def check_slow_consumers(self, now_ms: int) -> None:
        """Check every queue whose check period has come round."""
        due = self._slow_due
        while due and due[0][0] <= now_ms:
            _, name = heapq.heappop(due)
            queue = self.queues.get(name)
            settings = self.settings.resolve(queue.address) if queue is not None else None
            if queue is None or settings is None or not queue.consumers:
                self._slow_watched.discard(name)
                continue
            threshold = settings.slow_consumer_threshold
            if threshold < 0:
                self._slow_watched.discard(name)
                continue
            self._check_queue(queue, threshold, settings.slow_consumer_policy, now_ms)
            heapq.heappush(due, (now_ms + settings.slow_consumer_check_period * 1000, name))

    def _check_queue(self, queue: Queue, threshold: int, policy: str, now_ms: int) -> None:
        enough = queue.message_count >= max(threshold, 1)
        killed: set[int] = set()
        for consumer in list(queue.consumers):
            acked_then, since_ms = consumer.rate_mark
            consumer.rate_mark = (consumer.acked, now_ms)
            if consumer.browser or not enough or now_ms <= since_ms:
                continue
            rate = (consumer.acked - acked_then) * 1000 / (now_ms - since_ms)
            if rate >= threshold:
                continue
            counts = self.stats.slow_consumers
            counts[policy] = counts.get(policy, 0) + 1
            log.warning(
                "slow consumer on queue %s: consumer %s (link %r of container %r) on "
                "connection %s acknowledged %.2f messages/s, below slow-consumer-threshold "
                "%d (%s)",
                queue.name,
                consumer.id,
                consumer.link_name,
                consumer.container,
                consumer.connection,
                rate,
                threshold,
                policy,
            )
            if policy == "KILL" and consumer.connection not in killed:
                killed.add(consumer.connection)
                self._effects.append(
                    CloseConnection(
                        consumer.connection,
                        KILL_CONDITION,
                        f"slow consumer on queue {queue.name}: {rate:.2f} messages/s, below"
                        f" slow-consumer-threshold {threshold}",
                    )
                )

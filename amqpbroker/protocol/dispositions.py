"""Proton delivery state -> core outcome (B-041…B-048).

`MessagingHandler.on_released` fires for RELEASED *and* MODIFIED, so the adapter reads
`remote_state` itself and never relies on the reactor's classification.
"""

from __future__ import annotations

from proton import Delivery

from amqpbroker.core.outcomes import ACCEPTED, RELEASED, Modified, Outcome, Rejected


def outcome_of(delivery: Delivery) -> Outcome | None:
    """The terminal outcome the consumer sent, or None for no or a non-terminal state
    (B-048: no action; the message stays acquired)."""
    state = delivery.remote_state
    if state == Delivery.ACCEPTED:
        return ACCEPTED
    if state == Delivery.RELEASED:
        return RELEASED
    if state == Delivery.MODIFIED:
        remote = delivery.remote
        return Modified(
            delivery_failed=bool(remote.failed), undeliverable_here=bool(remote.undeliverable)
        )
    if state == Delivery.REJECTED:
        condition = delivery.remote.condition
        if condition is None:
            return Rejected()
        return Rejected(condition=condition.name, description=condition.description)
    return None

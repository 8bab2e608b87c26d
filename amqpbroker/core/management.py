"""The AMQP management address as the core sees it (B-104, B-154, B-160).

Theory of operation
-------------------
A message sent to `activemq.management` (on a producer link to it, or through the
anonymous relay) is a request, never routed: `Broker.publish` checks the sender's
`manage` permission (B-154; the link attach checks it too) and hands the message to the
injected `ManagementHandler`, which lives above the core (`management/amqp_address.py`:
it decodes the request, runs the operation through `core/operations.py` and publishes the
reply to the request's reply-to like any other message). The address itself never exists:
it is never auto-created (B-110), so consumers cannot attach to it.

The handler is a port, like `MessageCopier` and `SectionReader`: the core depends on this
`Protocol`, never on the module that implements it.
"""

from __future__ import annotations

from typing import Protocol

from amqpbroker.core.model import Message, ProducerTarget

MANAGEMENT_ADDRESS = "activemq.management"  # B-104 management-address


class ManagementHandler(Protocol):
    """Answers one management request (B-160); loop thread only."""

    def handle(self, request: Message, sender: ProducerTarget) -> None:
        """`sender`: the request's link, whose user the reply is sent as (B-154)."""

"""A consumer is handed at most the credit its client gave (B-037), however the client's
frames are batched.

The core's dispatches reach the engine when the step's effects are applied (or later,
behind a journal write, B-097), so a second flow in the same read found the engine's
credit not yet spent by the first one's dispatches: attach and flow sent together (what
most clients do) handed a consumer with credit 2 four messages, two of them held in the
engine, out of reach of the queue's other consumers.
"""

from __future__ import annotations

from random import Random

import pytest
from proton import Message
from support import pnloop as support
from unit.protocol.test_handler import Client

from amqpbroker.core import Broker, ManualClock, SettingsRepository
from amqpbroker.protocol import Shell, moves


@pytest.fixture(params=support.modes())
def shell(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Shell:
    support.use(request.param, monkeypatch)
    broker = Broker(
        settings=SettingsRepository(), clock=ManualClock(), rng=Random(0), copier=moves.COPIER
    )
    return Shell(broker)


def _delivering(shell: Shell, queue: str) -> int:
    address = shell.broker.post_office.addresses[queue]
    return sum(q.delivering for q in address.queues)


def _fill(client: Client, count: int) -> None:
    sender = client.sender("q", "queue")
    for i in range(count):
        client.send(sender, Message(body=f"m{i}"))


@pytest.mark.parametrize("credit", [1, 2, 7])
def test_attach_and_flow_together_hand_over_only_the_credit(shell: Shell, credit: int) -> None:
    """B-037: the attach and its first flow in one read: `credit` messages delivering."""
    client = Client(shell)
    _fill(client, 12)
    client.receiver("q", "queue", credit=credit)  # open and flow, then one pump
    assert len(client.received) == credit
    assert _delivering(shell, "q") == credit


def test_competing_consumers_share_what_their_credit_covers(shell: Shell) -> None:
    """B-037, B-030: three consumers of credit 2 hold 6 of 12; a fourth gets its 2."""
    client = Client(shell)
    _fill(client, 12)
    for i in range(3):
        client.receiver("q", "queue", credit=2, name=f"r{i}")
    assert _delivering(shell, "q") == 6
    client.receiver("q", "queue", credit=2, name="r3")
    assert len(client.received) == 8
    assert _delivering(shell, "q") == 8


def test_flows_batched_in_one_read_count_once(shell: Shell) -> None:
    """B-037: several flows of one link in one read (a client topping up its credit as it
    goes) hand over what the last one allows, no more."""
    client = Client(shell)
    _fill(client, 20)
    link = client.receiver("q", "queue", credit=1)
    assert len(client.received) == 1
    for _ in range(3):
        link.flow(1)  # three flows, each one more: credit 3 in all, sent in one read
    client.pump()
    assert len(client.received) == 4
    assert _delivering(shell, "q") == 4

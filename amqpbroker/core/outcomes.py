"""Delivery outcomes a consumer can send, as the core sees them (B-041…B-048)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import final


@final  # `Queue.settle` tells them apart by `type(o) is C` (issue 20)
@dataclass(frozen=True, slots=True)
class Accepted:
    """B-041: acknowledge and remove."""


@final  # `Queue.settle` tells them apart by `type(o) is C` (issue 20)
@dataclass(frozen=True, slots=True)
class Released:
    """B-042: return, undoing the delivery-count increment."""


@final  # `Queue.settle` tells them apart by `type(o) is C` (issue 20)
@dataclass(frozen=True, slots=True)
class Modified:
    """B-043…B-045: return; count the attempt if `delivery_failed`; block the link if
    `undeliverable_here`."""

    delivery_failed: bool = False
    undeliverable_here: bool = False


@final  # `Queue.settle` tells them apart by `type(o) is C` (issue 20)
@dataclass(frozen=True, slots=True)
class Rejected:
    """B-046: dead-letter at once (or drop without a DLA). The error is recorded only."""

    condition: str | None = None
    description: str | None = None


Outcome = Accepted | Released | Modified | Rejected

ACCEPTED = Accepted()
RELEASED = Released()
# A failed attempt: a rollback (B-143) and, under amqpRejectAsModified, a rejection (B-047).
FAILED = Modified(delivery_failed=True)

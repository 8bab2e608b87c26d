"""Errors raised on purpose by the core. `condition` is what the AMQP peer is told.

Expected outcomes (no route, dead-lettered, expired) are values, not exceptions; these
exceptions mean a request the broker refuses (STYLE.md section 6).
"""

from __future__ import annotations

from typing import ClassVar


class BrokerError(Exception):
    """Base of every error raised on purpose."""

    condition: ClassVar[str] = "amqp:internal-error"


class ClientError(BrokerError):
    """The peer asked for something invalid."""

    condition = "amqp:invalid-field"


class NotFound(ClientError):
    """The address or queue does not exist and may not be auto-created."""

    condition = "amqp:not-found"


class IllegalState(ClientError):
    """The request conflicts with the current state (e.g. a subscription in use)."""

    condition = "amqp:illegal-state"


class NotAuthorized(ClientError):
    """The user lacks the permission; the description names it."""

    condition = "amqp:unauthorized-access"


class ResourceLimitExceeded(ClientError):
    """A configured limit was hit (address full under FAIL, ...)."""

    condition = "amqp:resource-limit-exceeded"


class MaxConsumersReached(BrokerError):
    """Artemis answers max-consumers with internal-error (B-038 quirk, copied)."""

    condition = "amqp:internal-error"


class InvalidSelector(ClientError):
    """A selector or filter expression that does not parse (B-032)."""

    condition = "amqp:invalid-field"

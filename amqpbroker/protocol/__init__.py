"""The AMQP 1.0 protocol adapter: the only package that imports proton.

What the server wires: one `AmqpConnection` per socket (`connection.py` and its parts
`transfers.py`, `attach.py`, `transactions.py`), the `Shell` that applies the core's
effects (`shell.py`), `message_of` for recovery, the moved copy (`moves.py`) and the
broker's SASL layer (`sasl.py`).
"""

from amqpbroker.protocol.connection import AmqpConnection, SaslFactory
from amqpbroker.protocol.shell import Shell
from amqpbroker.protocol.transfers import message_of

__all__ = ["AmqpConnection", "SaslFactory", "Shell", "message_of"]

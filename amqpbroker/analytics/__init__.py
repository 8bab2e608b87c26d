"""PySpark jobs over the lifecycle event log (extra `amqpbroker[analytics]`).

The broker never imports this package; `amqpbroker analyze` imports it lazily. It
depends on the rest of amqpbroker only for the event field names (core.lifecycle).
"""

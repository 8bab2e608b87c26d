"""amqpbroker: an AMQP 1.0 message broker with the ActiveMQ Artemis address model."""

__version__ = "0.1.0"

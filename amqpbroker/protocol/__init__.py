"""The AMQP 1.0 protocol adapter: the only package that imports proton."""

"""Test support: broker fixtures, wait_until, a thin AMQP test client."""

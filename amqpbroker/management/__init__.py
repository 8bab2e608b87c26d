"""Management: the HTTP API (/api/v1, /healthz, /metrics) over the core operations, the
web console (/console/) and replay tasks."""

from amqpbroker.management.api import LoopBridge, ManagementApi
from amqpbroker.management.auth import BasicAuth
from amqpbroker.management.http import HttpServer

__all__ = ["BasicAuth", "HttpServer", "LoopBridge", "ManagementApi"]

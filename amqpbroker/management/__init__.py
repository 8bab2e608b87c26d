"""Management: the HTTP API (/api/v1, /healthz, /metrics) over the core operations."""

from amqpbroker.management.http import HttpServer, LoopBridge, ManagementApi

__all__ = ["HttpServer", "LoopBridge", "ManagementApi"]

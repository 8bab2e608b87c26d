"""Management: the HTTP API (/api/v1, /healthz, /metrics) over the core operations, the
AMQP management address (activemq.management), the web console (/console/) and replay
tasks."""

from amqpbroker.management.amqp_address import AmqpManagement
from amqpbroker.management.api import LoopBridge, ManagementApi
from amqpbroker.management.auth import BasicAuth
from amqpbroker.management.http import HttpServer

__all__ = ["AmqpManagement", "BasicAuth", "HttpServer", "LoopBridge", "ManagementApi"]

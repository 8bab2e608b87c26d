"""Configuration: YAML with Artemis key names, checked with file and line (CONTRACT.md).

`load_config` also reads an Artemis broker.xml (a `*.xml` file) into the same schema.
"""

from amqpbroker.config.artemis_xml import parse_artemis_xml
from amqpbroker.config.effective import defaults_only, format_effective
from amqpbroker.config.files import load_config
from amqpbroker.config.load import (
    ConfigError,
    ConfigProblem,
    default_config_path,
    parse_config,
)
from amqpbroker.config.schema import (
    AcceptorConfig,
    AddressConfig,
    BrokerConfig,
    EventLogConfig,
    HttpConfig,
    MetricsConfig,
    PersistenceConfig,
    QueueDef,
    SecurityConfig,
    TlsConfig,
    UserConfig,
)
from amqpbroker.core.security import PERMISSIONS

__all__ = [
    "PERMISSIONS",
    "AcceptorConfig",
    "AddressConfig",
    "BrokerConfig",
    "ConfigError",
    "ConfigProblem",
    "EventLogConfig",
    "HttpConfig",
    "MetricsConfig",
    "PersistenceConfig",
    "QueueDef",
    "SecurityConfig",
    "TlsConfig",
    "UserConfig",
    "default_config_path",
    "defaults_only",
    "format_effective",
    "load_config",
    "parse_artemis_xml",
    "parse_config",
]

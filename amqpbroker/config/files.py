"""Reading a config file: YAML, or an Artemis broker.xml when it is named `*.xml`.

Its own module, above both parsers, so that `load.py` (YAML) and `artemis_xml.py` (which
reuses load's checks) do not import each other (issue 18).
"""

from __future__ import annotations

from pathlib import Path

from amqpbroker.config.artemis_xml import parse_artemis_xml
from amqpbroker.config.load import ConfigError, ConfigProblem, parse_config
from amqpbroker.config.schema import BrokerConfig

__all__ = ["load_config"]


def load_config(path: Path | str) -> BrokerConfig:
    """Read and check a config file: YAML, or an Artemis broker.xml when named `*.xml`.

    Raises:
        ConfigError: the file has problems (all of them are listed).
        OSError: the file cannot be read.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        problem = ConfigProblem(str(path), line, "(file)", f"not UTF-8 text: {e.reason}")
        raise ConfigError([problem]) from None
    if path.suffix.lower() == ".xml":
        return parse_artemis_xml(text, source=str(path))
    return parse_config(text, source=str(path))

"""The one table of configuration keys amqpbroker accepts only at their default (issue 19).

Theory of operation
-------------------
A broker must never pretend. Every address-setting and queue option the loader accepts is
read by code that acts on it, except the keys listed here, which amqpbroker does not
implement. The loader (config/load.py, and through it the broker.xml reader) accepts such
a key only at its built-in default, the value that describes what the broker does anyway
(so a file that spells out the defaults, as CONTRACT.md's example and many Artemis
broker.xml files do, still loads), and refuses any other value with

    config/broker.yaml:12: address-settings."#".config-delete-queues: not supported by amqpbroker

`check-config` and the HTTP API (`settings` of a queue) leave these keys out of the
effective settings. `tests/unit/config/test_no_silent_keys.py` walks the schema: a key that
is neither listed here nor read by code fails it, and so does a key listed here that code
reads: delete its line here when you implement it. Each decision is in docs/decisions.md.

Values are the reason a user is shown after "not supported by amqpbroker" ("" for none).
"""

from __future__ import annotations

# Address-settings (`ResolvedSettings` field names).
UNSUPPORTED_SETTINGS: dict[str, str] = {
    # Refused (h-mgmt, issue 19; docs/decisions.md "No silent keys").
    "config_delete_queues": "the configuration is not reloaded at runtime",
    "config_delete_addresses": "the configuration is not reloaded at runtime",
    "redistribution_delay": "a cluster setting",
}

# Queue options of `addresses[].anycast[]` / `multicast[]` (`QueueDef` field names).
UNSUPPORTED_QUEUE_OPTIONS: dict[str, str] = {}


def unsupported_message(reason: str, default: object) -> str:
    """The loader's message for a non-default value of a key listed above."""
    if default is None or isinstance(default, bool):
        shown = {None: "null", True: "true", False: "false"}[default]
    else:
        shown = repr(default)
    because = f": {reason}" if reason else ""
    return f"not supported by amqpbroker{because} (only the default, {shown}, is accepted)"

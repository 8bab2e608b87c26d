"""What `amqpbroker check-config FILE` prints: the settings the broker would run with.

The address-settings part answers "what will this address actually get?": each key shows
its resolved value (B-100 overlay, B-103 defaults) and, as a comment, the pattern that set
it, so an overlay that does not apply is visible at once.
"""

from __future__ import annotations

import json
from typing import Any

from amqpbroker.config.schema import AcceptorConfig, BrokerConfig, EventLogConfig
from amqpbroker.core import RoutingType, SettingsRepository

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def defaults_only(config: BrokerConfig) -> str | None:
    """Why a config that sets nothing (an empty or commented-out file: a truncated copy?)
    deserves a look: the built-in defaults have no dead-letter address, so a `rejected`
    message is dropped (B-046, B-103). `run` logs it, `check-config` prints it (user pass).
    None for a config that sets anything."""
    if config != BrokerConfig(source=config.source):
        return None
    return (
        f"{config.source} sets nothing: the built-in defaults apply (no dead-letter or expiry "
        "address: a rejected message is dropped); config/broker.yaml is the shipped example"
    )


def format_effective(config: BrokerConfig) -> str:
    """Acceptors, HTTP, persistence and the other broker-level values, then the effective
    address-settings of every configured address and every settings pattern."""
    lines = [f"# {config.source}: OK", f"name: {config.name}"]
    if (note := defaults_only(config)) is not None:
        lines.insert(1, f"# {note}")
    if config.data_dir is not None:
        lines.append(f"data-dir: {config.data_dir}")
    lines.append("acceptors:")
    lines += [f"  - {_acceptor(a)}" for a in config.acceptors]
    http = config.http
    lines.append(
        f"http: {http.host}:{http.port} read-timeout={http.read_timeout} "
        f"max-connections={http.max_connections} sample-interval={http.sample_interval}"
        + (f" analyze-report={http.analyze_report}" if http.analyze_report else "")
        if http.enabled
        else "http: disabled"
    )
    p = config.persistence
    lines.append(
        f"persistence: enabled={_scalar(p.enabled)} sync={_scalar(p.sync)} "
        f"persist-delivery-count-before-delivery="
        f"{_scalar(p.persist_delivery_count_before_delivery)}"
    )
    for key, value in (
        ("message-expiry-scan-period", config.message_expiry_scan_period),
        ("address-queue-scan-period", config.address_queue_scan_period),
        ("max-redelivery-records", config.max_redelivery_records),
        ("id-cache-size", config.id_cache_size),
        (
            "global-max-size",
            config.global_max_size
            if config.global_max_size >= 0
            else "auto (half the memory limit)",
        ),
        (
            "max-disk-usage",
            f"{config.max_disk_usage}%" if config.max_disk_usage >= 0 else "off",
        ),
        ("disk-scan-period", config.disk_scan_period),
    ):
        lines.append(f"{key}: {value}")
    e = config.event_log
    lines.append(f"event-log: {e.level if e.enabled else 'off'}")
    if e.enabled and e.level != "off":
        lines.append(_event_log_files(e))
    if config.metrics.artemis_names:
        lines.append("metrics: artemis-names=true")
    w = config.wildcard_addresses
    lines.append(
        f"wildcard-addresses: enabled={_scalar(w.enabled)} delimiter={w.delimiter!r} "
        f"any-words={w.any_words!r} single-word={w.single_word!r}"
    )
    s = config.security
    if s.enabled:
        lines.append(
            f"security: enabled sasl-mechanisms={','.join(s.sasl_mechanisms)} "
            f"users={len(s.users)} security-settings={len(s.security_settings)}"
        )
    else:
        lines.append("security: disabled")
    lines += _address_settings(config)
    return "\n".join(lines)


def _event_log_files(e: EventLogConfig) -> str:
    """Rotation, compression and the disk budget (issue 17); `auto`: the share of the data
    directory's file system the writer works out when it starts."""
    total = "auto (min 10% of file system, 2 GiB)" if e.max_total_bytes is None else None
    free = "auto (min 5% of file system, 1 GiB)" if e.min_free_bytes is None else None
    return (
        f"event-log-files: max-file-bytes={e.max_file_bytes} max-file-age={e.max_file_age} "
        f"compress={_scalar(e.compress)} max-total-bytes={total or e.max_total_bytes} "
        f"max-age={e.max_age} keep-until-analyzed={_scalar(e.keep_until_analyzed)} "
        f"min-free-bytes={free or e.min_free_bytes}"
    )


def _acceptor(a: AcceptorConfig) -> str:
    text = f"{a.name}: {a.scheme}://{a.host}:{a.port}"
    for key, value in (
        ("anycast-prefix", a.anycast_prefix),
        ("multicast-prefix", a.multicast_prefix),
    ):
        if value:
            text += f" {key}={value!r}"
    if a.tls is not None:
        text += f" tls(cert-file={a.tls.cert_file}, client-auth={a.tls.client_auth})"
    if a.amqp_treat_reject_as_unmodified_delivery_failed:
        text += " amqp-treat-reject-as-unmodified-delivery-failed=true"
    if not a.amqp_duplicate_detection:
        text += " amqp-duplicate-detection=false"
    if a.max_message_size:
        text += f" max-message-size={a.max_message_size}"
    text += (
        f" handshake-timeout={a.handshake_timeout}s amqp-idle-timeout={a.amqp_idle_timeout}ms"
        f" connections-allowed={a.connections_allowed}"
        f" handshakes-per-source={a.handshakes_per_source}"
    )
    return text


def _address_settings(config: BrokerConfig) -> list[str]:
    repo = SettingsRepository(dict(config.address_settings), wildcards=config.wildcard_addresses)
    addresses = {a.name: a for a in config.addresses}
    names = [*addresses, *(p for p in config.address_settings if p not in addresses)]
    lines = ["effective address-settings:  # value, then the pattern that sets it"]
    for name in names:
        address = addresses.get(name)
        if address is not None:
            listed = [f"{q.name}(ANYCAST)" for q in address.anycast]
            listed += [f"{q.name}(MULTICAST)" for q in address.multicast]
            lines.append(f"  {_key(name)}:  # address; queues: {', '.join(listed) or 'none'}")
        else:
            lines.append(f"  {_key(name)}:  # settings pattern")
        matches = repo.matching(name)
        lines.append(f"    matched-by: {', '.join(_key(m) for m in matches) or '(defaults only)'}")
        set_by: dict[str, str] = {}  # field -> most specific pattern that sets it
        for pattern in reversed(matches):
            set_by.update(dict.fromkeys(config.address_settings[pattern].as_dict(), pattern))
        for key, value in repo.resolve(name).to_config().items():
            field = key.replace("-", "_")
            if field in set_by:
                origin = f"  # {_key(set_by[field])}"
            elif field == "max_redelivery_delay":
                origin = "  # redelivery-delay x 10"
            else:
                origin = ""
            lines.append(f"    {key}: {_scalar(value)}{origin}")
    return lines


def _key(name: str) -> str:
    """A name as a YAML key: quoted unless plain (so '#' does not read as a comment)."""
    return name if name and set(name) <= _PLAIN else json.dumps(name, ensure_ascii=False)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, RoutingType):
        return value.value
    if value == "":
        return '""'
    return str(value)

"""What `amqpbroker check-config FILE` prints: the settings the broker would run with."""

from __future__ import annotations

from amqpbroker.config.schema import BrokerConfig
from amqpbroker.core import SettingsRepository


def format_effective(config: BrokerConfig) -> str:
    """Acceptors, HTTP, persistence, then the effective address-settings (B-100 overlay,
    B-103 defaults) of every configured address and settings pattern."""
    lines = [f"# {config.source}: OK", f"name: {config.name}", "acceptors:"]
    for a in config.acceptors:
        prefixes = "".join(
            f" {k}={v!r}"
            for k, v in (
                ("anycast-prefix", a.anycast_prefix),
                ("multicast-prefix", a.multicast_prefix),
            )
            if v
        )
        tls = f" tls(client-auth={a.tls.client_auth})" if a.tls else ""
        lines.append(f"  - {a.name}: {a.scheme}://{a.host}:{a.port}{prefixes}{tls}")
    http = config.http
    lines.append(f"http: {f'{http.host}:{http.port}' if http.enabled else 'disabled'}")
    p = config.persistence
    lines.append(
        f"persistence: enabled={p.enabled} sync={p.sync} "
        f"persist-delivery-count-before-delivery="
        f"{p.persist_delivery_count_before_delivery}"
    )
    lines.append(f"message-expiry-scan-period: {config.message_expiry_scan_period}")
    lines.append(f"address-queue-scan-period: {config.address_queue_scan_period}")
    lines.append(f"max-redelivery-records: {config.max_redelivery_records}")
    e = config.event_log
    lines.append(f"event-log: {e.level if e.enabled else 'off'}")
    lines.append(f"security: {'enabled' if config.security.enabled else 'disabled'}")
    repo = SettingsRepository(dict(config.address_settings), wildcards=config.wildcard_addresses)
    names = [a.name for a in config.addresses]
    names += [p for p in config.address_settings if p not in names]
    lines.append("effective address-settings:")
    for name in names:
        queues = next((a for a in config.addresses if a.name == name), None)
        title = f"  {name}:"
        if queues is not None:
            listed = [f"{q.name}(ANYCAST)" for q in queues.anycast]
            listed += [f"{q.name}(MULTICAST)" for q in queues.multicast]
            title += f"  # address; queues: {', '.join(listed) or 'none'}"
        else:
            title += "  # settings pattern"
        lines.append(title)
        matches = repo.matching(name)
        lines.append(f"    matched-by: {', '.join(repr(m) for m in matches) or '(defaults only)'}")
        for key, value in repo.resolve(name).to_config().items():
            lines.append(f"    {key}: {_yaml_scalar(value)}")
    return "\n".join(lines)


def _yaml_scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    return str(value)

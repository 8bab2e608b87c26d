"""The `amqpbroker` command: argparse -> commands.

A user error is one line on stderr and exit 1; bad usage exits 2 (argparse); never a
traceback for something the user can fix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from amqpbroker import __version__

log = logging.getLogger("amqpbroker")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def raise_descriptor_limit() -> None:
    """Raise the soft RLIMIT_NOFILE to the hard limit (issue 15 item 7): every connection
    holds a descriptor, and a default soft limit of 1024 starves a busy broker."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, hard, e)
            return
    log.info("open-files limit: %d", hard)


def _cmd_run(args: argparse.Namespace) -> int:
    from amqpbroker.config import ConfigError, default_config_path, load_config
    from amqpbroker.server import BrokerServer, StartupError, tune_gc

    _setup_logging(args.log_level)
    path = Path(args.config) if args.config else default_config_path()
    try:
        config = load_config(path)
    except ConfigError as e:
        print(str(e), file=sys.stderr)  # noqa: T201 - the user-facing error report
        print(f"amqpbroker: not starting: {path} has errors", file=sys.stderr)  # noqa: T201
        return 1
    except OSError as e:
        print(f"amqpbroker: cannot read config {path}: {e.strerror}", file=sys.stderr)  # noqa: T201
        return 1
    data_dir = Path(args.data_dir or config.data_dir or "./data")
    raise_descriptor_limit()

    async def serve() -> None:
        server = BrokerServer(
            config, data_dir=data_dir, skip_corrupt_journal=args.skip_corrupt_journal
        )
        await server.start()
        tune_gc()
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        await stopping.wait()
        log.info("signal received: shutting down")
        await server.stop()

    try:
        asyncio.run(serve())
    except (OSError, StartupError) as e:
        log.error("cannot start: %s", e)
        return 1
    return 0


def _cmd_journal_export(args: argparse.Namespace) -> int:
    from amqpbroker.store.journal import JournalError, export_jsonl

    directory = Path(args.data_dir) / "journal"
    if not directory.is_dir():
        raise CommandError(f"no journal in {args.data_dir} (expected {directory})")
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115
    try:
        for line in export_jsonl(directory):
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
    except JournalError as e:
        raise CommandError(f"cannot read the journal: {e}") from e
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _cmd_check_config(args: argparse.Namespace) -> int:
    from amqpbroker.config import ConfigError, format_effective, load_config

    try:
        config = load_config(Path(args.file))
    except ConfigError as e:
        print(str(e), file=sys.stderr)  # noqa: T201
        return 1
    except OSError as e:
        print(f"amqpbroker: cannot read {args.file}: {e.strerror}", file=sys.stderr)  # noqa: T201
        return 1
    print(format_effective(config))  # noqa: T201
    return 0


DEFAULT_URL = "http://127.0.0.1:8161"


class CommandError(Exception):
    """A user-facing failure: one line on stderr, exit 1."""


def _api(url: str, path: str, body: dict[str, object] | None = None) -> object:
    """Call the broker's HTTP API; errors become one-line CommandErrors."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url.rstrip("/") + path,
        data=data,
        method="POST" if data is not None else "GET",
        headers={"Content-Type": "application/json"} if data is not None else {},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        try:
            message = json.loads(e.read()).get("error", e.reason)
        except ValueError:
            message = e.reason
        raise CommandError(f"{message} (HTTP {e.code})") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CommandError(f"cannot reach the broker at {url}: {reason}") from None


def _table(rows: list[dict[str, object]], columns: list[str]) -> str:
    widths = {c: max([len(c), *(len(str(r.get(c, ""))) for r in rows)]) for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns)]
    for r in rows:
        lines.append("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns))
    return "\n".join(lines)


def _out(args: argparse.Namespace, value: object, human: str) -> None:
    print(json.dumps(value, indent=2) if args.json else human)  # noqa: T201


def _quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _cmd_queues(args: argparse.Namespace) -> int:
    rows = _api(args.url, "/api/v1/queues")
    assert isinstance(rows, list)
    columns = [
        "address",
        "name",
        "routing_type",
        "messages",
        "delivering",
        "scheduled",
        "consumers",
        "added",
        "acknowledged",
        "dead_lettered",
        "expired",
    ]
    _out(args, rows, _table(sorted(rows, key=lambda r: (r["address"], r["name"])), columns))
    return 0


def _cmd_messages(args: argparse.Namespace) -> int:
    query = f"?limit={args.limit}" + (
        f"&filter={urllib.parse.quote(args.filter)}" if args.filter else ""
    )
    rows = _api(args.url, f"/api/v1/queues/{_quoted(args.queue)}/messages{query}")
    assert isinstance(rows, list)
    human = []
    for m in rows:
        reason = m["message_annotations"].get("x-opt-DLQ-REASON")
        origin = m["message_annotations"].get("x-opt-ORIG-ADDRESS")
        human.append(
            {
                "msg_id": m["msg_id"],
                "count": m["delivery_count"],
                "origin": origin or "",
                "reason": reason or "",
                "properties": json.dumps(m["application_properties"])[:40],
                "body": m["body_preview"][:40],
            }
        )
    _out(
        args,
        rows,
        _table(human, ["msg_id", "count", "origin", "reason", "properties", "body"])
        if human
        else "(no messages)",
    )
    return 0


def _read_ids(path: str) -> list[int]:
    """A redrive list: JSON lines with `msg_id`, or one id per line (CONTRACT)."""
    ids = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise CommandError(f"cannot read {path}: {e.strerror}") from None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
            ids.append(int(value["msg_id"] if isinstance(value, dict) else value))
        except (ValueError, KeyError, TypeError):
            raise CommandError(f"{path}:{number}: expected a msg_id: {line[:60]!r}") from None
    return ids


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty() and total:
        width = 30
        filled = width * done // total
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        sys.stderr.flush()


def _cmd_retry(args: argparse.Namespace) -> int:
    path = f"/api/v1/queues/{_quoted(args.queue)}/retry"
    ids = _read_ids(args.ids) if args.ids else None
    if args.rate is None:
        body: dict[str, object] = {"filter": args.filter}
        if ids is not None:
            body["ids"] = ids
        result = _api(args.url, path, body)
        assert isinstance(result, dict)
        _out(args, result, f"retried {result['retried']} message(s) from {args.queue}")
        return 0
    # Throttled: resolve the ids, then send paced chunks with a progress bar.
    if ids is None:
        rows = _api(
            args.url,
            f"/api/v1/queues/{_quoted(args.queue)}/messages?limit=1000000"
            + (f"&filter={urllib.parse.quote(args.filter)}" if args.filter else ""),
        )
        assert isinstance(rows, list)
        ids = [r["msg_id"] for r in rows]
    retried = 0
    chunk = max(1, min(100, int(args.rate)))
    started = time.monotonic()
    for i in range(0, len(ids), chunk):
        part = ids[i : i + chunk]
        result = _api(args.url, path, {"ids": part})
        assert isinstance(result, dict)
        retried += int(result["retried"])
        _progress(i + len(part), len(ids))
        pause = started + (i + len(part)) / args.rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    if sys.stderr.isatty() and ids:
        sys.stderr.write("\n")
    _out(args, {"retried": retried}, f"retried {retried} message(s) from {args.queue}")
    return 0


def _cmd_move(args: argparse.Namespace) -> int:
    result = _api(
        args.url,
        f"/api/v1/queues/{_quoted(args.queue)}/move",
        {"to-queue": args.to_queue, "filter": args.filter},
    )
    assert isinstance(result, dict)
    _out(args, result, f"moved {result['moved']} message(s) from {args.queue} to {args.to_queue}")
    return 0


def _cmd_purge(args: argparse.Namespace) -> int:
    result = _api(args.url, f"/api/v1/queues/{_quoted(args.queue)}/purge", {"filter": args.filter})
    assert isinstance(result, dict)
    _out(args, result, f"removed {result['removed']} message(s) from {args.queue}")
    return 0


def _cmd_certs_create(args: argparse.Namespace) -> int:
    from amqpbroker.security import create_certificates

    try:
        files = create_certificates(Path(args.out), args.host or ["localhost"], client=args.client)
    except OSError as e:
        raise CommandError(f"cannot write certificates to {args.out}: {e.strerror}") from None
    print(f"CA certificate:     {files.ca_cert}")  # noqa: T201
    print(f"server certificate: {files.server_cert}")  # noqa: T201
    print(f"server key:         {files.server_key}")  # noqa: T201
    config = (
        f"tls: {{cert-file: {files.server_cert}, key-file: {files.server_key}, "
        f"ca-file: {files.ca_cert}}}"
    )
    print(f"acceptor config:    {config}")  # noqa: T201
    return 0


def _cmd_user_hash(args: argparse.Namespace) -> int:
    import getpass

    from amqpbroker.security import hash_password

    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            raise CommandError("the passwords do not match")
    if not password:
        raise CommandError("an empty password is not allowed")
    print(hash_password(password))  # noqa: T201
    return 0


def _cmd_analyze(args: argparse.Namespace) -> int:
    """Hand the arguments to the PySpark job; imported here so the broker never loads it."""
    try:
        from amqpbroker.analytics.job import main as analyze
    except ImportError as e:
        raise CommandError(
            f"analyze needs the analytics extra: pip install 'amqpbroker[analytics]' ({e})"
        ) from None
    return analyze(args.job_args, prog="amqpbroker analyze")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amqpbroker",
        description="AMQP 1.0 message broker with the ActiveMQ Artemis address model.",
    )
    parser.add_argument("--version", action="version", version=f"amqpbroker {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="start the broker in the foreground")
    run.add_argument(
        "--config", metavar="FILE", help="YAML config (default: the embedded config/broker.yaml)"
    )
    run.add_argument(
        "--data-dir",
        metavar="DIR",
        help="journal, event log and ports.json (default: data-dir key, ./data)",
    )
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.add_argument(
        "--skip-corrupt-journal",
        action="store_true",
        help="start even if a journal record in the middle is corrupt (its contents are lost)",
    )
    run.set_defaults(func=_cmd_run)

    check = commands.add_parser(
        "check-config", help="validate a config file and print the effective settings"
    )
    check.add_argument("file", metavar="FILE")
    check.set_defaults(func=_cmd_check_config)

    def management(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument(
            "--url", default=DEFAULT_URL, help=f"the broker's HTTP API (default {DEFAULT_URL})"
        )
        sub.add_argument("--json", action="store_true", help="JSON output for scripts")
        return sub

    queues = management("queues", "table of queues and their counters")
    queues.set_defaults(func=_cmd_queues)
    messages = management("messages", "browse messages of a queue (not consumed)")
    messages.add_argument("queue", metavar="QUEUE")
    messages.add_argument("--limit", type=int, default=20)
    messages.add_argument("--filter", metavar="SELECTOR")
    messages.set_defaults(func=_cmd_messages)
    retry = management("retry", "send dead-lettered/expired messages back to their address")
    retry.add_argument("queue", metavar="QUEUE")
    retry.add_argument("--filter", metavar="SELECTOR")
    retry.add_argument(
        "--ids", metavar="FILE", help="redrive list: JSON lines with msg_id, or one id per line"
    )
    retry.add_argument("--rate", type=float, metavar="N", help="at most N messages/s")
    retry.set_defaults(func=_cmd_retry)
    move = management("move", "move messages to another queue")
    move.add_argument("queue", metavar="QUEUE")
    move.add_argument("--to-queue", required=True, metavar="NAME")
    move.add_argument("--filter", metavar="SELECTOR")
    move.set_defaults(func=_cmd_move)
    purge = management("purge", "delete messages")
    purge.add_argument("queue", metavar="QUEUE")
    purge.add_argument("--filter", metavar="SELECTOR")
    purge.set_defaults(func=_cmd_purge)

    journal = commands.add_parser("journal", help="the durable message journal")
    journal_commands = journal.add_subparsers(
        dest="journal_command", required=True, metavar="COMMAND"
    )
    export = journal_commands.add_parser(
        "export", help="dump the journal as JSON lines (broker stopped)"
    )
    export.add_argument("--data-dir", required=True, metavar="DIR")
    export.add_argument("--out", metavar="FILE", help="write here instead of standard output")
    export.set_defaults(func=_cmd_journal_export)

    # The job parses its own options (they are also spark-submit's): pass everything on.
    # prefix_chars="+" makes argparse treat --events etc. as plain words to forward.
    analyze = commands.add_parser(
        "analyze",
        help="dead-letter triage over the event log (PySpark; see `analyze --help`)",
        add_help=False,
        prefix_chars="+",
    )
    analyze.add_argument("job_args", nargs=argparse.REMAINDER)
    analyze.set_defaults(func=_cmd_analyze)

    certs = commands.add_parser("certs", help="development TLS certificates")
    certs_commands = certs.add_subparsers(dest="certs_command", required=True, metavar="COMMAND")
    create = certs_commands.add_parser(
        "create", help="create a CA and a server certificate/key (development use)"
    )
    create.add_argument("--out", required=True, metavar="DIR")
    create.add_argument(
        "--host",
        action="append",
        metavar="NAME",
        help="DNS name or IP for the server certificate (repeatable; default localhost)",
    )
    create.add_argument(
        "--client", metavar="CN", help="also create client.pem/client.key with this common name"
    )
    create.set_defaults(func=_cmd_certs_create)

    user = commands.add_parser("user", help="users for SASL authentication")
    user_commands = user.add_subparsers(dest="user_command", required=True, metavar="COMMAND")
    hasher = user_commands.add_parser(
        "hash", help="print an scrypt hash for security.users.NAME.password-hash"
    )
    hasher.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from standard input (never from argv)",
    )
    hasher.set_defaults(func=_cmd_user_hash)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except CommandError as e:
        print(f"amqpbroker: {e}", file=sys.stderr)  # noqa: T201
        return 1
    return code

"""The `amqpbroker` command: argparse -> commands.

A user error is one line on stderr and exit 1; bad usage exits 2 (argparse); never a
traceback for something the user can fix.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from amqpbroker import __version__

log = logging.getLogger("amqpbroker")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _cmd_run(args: argparse.Namespace) -> int:
    from amqpbroker.config import ConfigError, default_config_path, load_config
    from amqpbroker.server import BrokerServer, StartupError

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

    async def serve() -> None:
        server = BrokerServer(config, data_dir=data_dir)
        await server.start()
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
    run.set_defaults(func=_cmd_run)

    check = commands.add_parser(
        "check-config", help="validate a config file and print the effective settings"
    )
    check.add_argument("file", metavar="FILE")
    check.set_defaults(func=_cmd_check_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code

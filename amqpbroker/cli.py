"""The `amqpbroker` command: argparse -> commands.

A user error is one line on stderr and exit 1; bad usage exits 2 (argparse); never a
traceback for something the user can fix.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import json
import logging
import os
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amqpbroker import __version__

if TYPE_CHECKING:
    from amqpbroker.config import BrokerConfig

log = logging.getLogger("amqpbroker")


LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# Line breaks and other control characters, as escapes: a log line is one line.
_LINE_ESCAPES = {
    code: {"\n": "\\n", "\r": "\\r"}.get(chr(code), f"\\x{code:02x}")
    for code in (*range(0x20), 0x7F, 0x85)
    if code != 0x09
} | {0x2028: "\\u2028", 0x2029: "\\u2029"}


# What the CLI prints of a broker's answer: also tabs and the C1 controls (0x9B is a
# terminal's CSI). A message body, a property or an annotation is a producer's text: a
# body of `\x1b]0;...\x07` or `\x1b[2J` reached the operator's terminal as commands
# (sixth attack pass).
_TERMINAL_ESCAPES = (
    _LINE_ESCAPES | {0x09: "\\t"} | {code: f"\\x{code:02x}" for code in range(0x80, 0xA0)}
)


def _shown(value: object) -> str:
    """`value` as the CLI prints it: control characters as escapes."""
    return str(value).translate(_TERMINAL_ESCAPES)


class OneLineFormatter(logging.Formatter):
    """Each record's message on one line: what a peer sends (a container-id, a link or
    address name) is logged as it came, and a line break in it forged whole log lines,
    `ERROR` included (issue 15 attack). A traceback keeps its own lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record).translate(_LINE_ESCAPES)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=LOG_FORMAT,
        stream=sys.stderr,
    )
    for handler in logging.getLogger().handlers:
        handler.setFormatter(OneLineFormatter(LOG_FORMAT))


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


DATA_DIR_LOCK = "broker.lock"


def lock_data_dir(data_dir: Path) -> int:
    """One broker per data directory, whatever it keeps there: an exclusive flock on
    `DATA_DIR/broker.lock`, held (fd left open, not inherited by children) until the
    process exits, a kill -9 included. The journal's own lock covers only
    `persistence.enabled: true`; without it a second broker on the same directory would
    delete the first one's page files, share its message-id block and event log (crash
    pass, docs/decisions.md). Raises OSError naming the directory and the file."""
    import fcntl

    path = data_dir / DATA_DIR_LOCK
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except (FileExistsError, NotADirectoryError):
        # mkdir's own text for a file in the way was "[Errno 17] File exists: 'DIR'"
        raise OSError(
            f"data directory {data_dir}: a file, not a directory, is in the way"
        ) from None
    except OSError as e:  # read-only, no permission, no room: one line naming the directory
        raise OSError(f"data directory {data_dir}: cannot create {path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OSError(
            f"data directory {data_dir} is in use by another broker ({path} is locked;"
            " is the broker running?)"
        ) from None
    return fd


def _cmd_run(args: argparse.Namespace) -> int:
    from amqpbroker.config import ConfigError, default_config_path, defaults_only, load_config
    from amqpbroker.server import BrokerServer, StartupError, tune_gc

    _setup_logging(args.log_level)
    # expanduser: `--config=~/b.yaml` reaches us unexpanded (a shell expands `~` only at a
    # word's start); the config's own paths are expanded by the loader (user pass)
    path = Path(args.config).expanduser() if args.config else default_config_path()
    try:
        config = load_config(path)
    except ConfigError as e:
        print(str(e), file=sys.stderr)  # noqa: T201 - the user-facing error report
        print(f"amqpbroker: not starting: {path} has errors", file=sys.stderr)  # noqa: T201
        return 1
    except OSError as e:
        print(f"amqpbroker: cannot read config {path}: {e.strerror}", file=sys.stderr)  # noqa: T201
        return 1
    if (note := defaults_only(config)) is not None:
        log.warning("%s", note)
    data_dir = Path(args.data_dir or config.data_dir or "./data").expanduser()
    raise_descriptor_limit()
    try:
        lock_data_dir(data_dir)
    except OSError as e:
        log.error("cannot start: %s", e)
        return 1

    async def serve() -> None:
        server = BrokerServer(
            config, data_dir=data_dir, skip_corrupt_journal=args.skip_corrupt_journal
        )
        server.freeze_recovered = True  # tune_gc() freezes the start-up heap anyway
        # Handlers first: a SIGTERM that comes as soon as ports.json names the port (while
        # start-up finishes) is an orderly stop, not a kill with -15.
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        await server.start()
        tune_gc()
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
    try:  # a path in a missing directory was a traceback (user pass)
        out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115
    except OSError as e:
        raise CommandError(f"cannot write {args.out}: {e.strerror}") from None
    try:
        for line in export_jsonl(directory):
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
        out.flush()  # here, where a full disk is caught, not in close()
    except JournalError as e:
        raise CommandError(f"cannot read the journal: {e}") from e
    except BrokenPipeError:
        raise
    except OSError as e:  # a full disk under --out, or a journal file not readable
        where = e.filename or args.out or "standard output"
        raise CommandError(f"cannot export the journal: {where}: {e.strerror}") from None
    finally:
        if out is not sys.stdout:
            with contextlib.suppress(OSError):  # already reported: a failed flush again
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
    if problems := _tls_problems(config):  # what `run` would stop on (issue 15)
        for problem in problems:
            print(f"{args.file}: {problem}", file=sys.stderr)  # noqa: T201
        return 1
    print(format_effective(config))  # noqa: T201
    return 0


def _tls_problems(config: BrokerConfig) -> list[str]:
    """The TLS files of every amqps acceptor, loaded as `run` loads them: the config
    objects never touch files, so check-config does it here."""
    from amqpbroker.security import TlsFileError, acceptor_context

    problems = []
    for acceptor in config.acceptors:
        if acceptor.tls is not None:
            try:
                acceptor_context(acceptor.name, acceptor.tls)
            except TlsFileError as e:
                problems.append(str(e))
    return problems


DEFAULT_URL = "http://127.0.0.1:8161"
USER_ENV = "AMQPBROKER_USER"
PASSWORD_ENV = "AMQPBROKER_PASSWORD"


class CommandError(Exception):
    """A user-facing failure: one line on stderr, exit 1."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The broker's HTTP API: its URL without credentials (safe to print) and the
    Authorization header to send, if any. Prints as the URL."""

    url: str
    user: str | None = None
    authorization: str | None = None

    def __str__(self) -> str:
        return self.url


def _endpoint(args: argparse.Namespace) -> Endpoint:
    """--url (credentials in it percent-decoded), else --user or AMQPBROKER_USER; the
    password from the URL, --password-stdin, AMQPBROKER_PASSWORD or a prompt."""
    raw: str = args.url
    split = urllib.parse.urlsplit(raw)
    host = split.netloc.rpartition("@")[2]
    url = urllib.parse.urlunsplit((split.scheme, host, _base_path(split.path), "", ""))
    if split.scheme not in ("http", "https") or not host or split.query or split.fragment:
        shown = urllib.parse.urlunsplit((split.scheme, host, split.path, split.query, ""))
        raise CommandError(f"--url must look like http://HOST:PORT, not {shown!r}")  # no password
    user = urllib.parse.unquote(split.username) if split.username else None
    password = urllib.parse.unquote(split.password) if split.password is not None else None
    user = user or args.user or os.environ.get(USER_ENV) or None
    if user is None:
        return Endpoint(url)
    if password is None:
        password = _read_password(args, user)
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return Endpoint(url, user, f"Basic {token}")


def _base_path(path: str) -> str:
    """The path before the API's own, as a user may type it: with or without a trailing
    slash, `/api` or `/api/v1` (the API's prefix, which the commands add) left out; any
    other path (a reverse proxy's mount point) is kept."""
    path = path.rstrip("/")
    for api in ("/api/v1", "/api"):
        if path.endswith(api):
            return path.removesuffix(api)
    return path


def _read_password(args: argparse.Namespace, user: str) -> str:
    import getpass

    if args.password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    from_env = os.environ.get(PASSWORD_ENV)
    if from_env is not None:
        return from_env
    if sys.stdin.isatty():
        return getpass.getpass(f"Password for {user}: ")
    raise CommandError(f"no password for user {user}: set {PASSWORD_ENV} or use --password-stdin")


# Third attack pass: what the CLI reads of one API answer, and for how long. The
# endpoint is whatever --url names (a typo, a proxy, a compromised host): an endless or
# trickled answer made the CLI read until memory ran out, or forever. 256 MiB holds a
# queue list of ~100,000 queues (~2.5 KB each) or a browse page of large headers; an
# error answer is one line. The time is for the whole answer, not one read (which has
# the socket timeout, 60 s).
MAX_ANSWER_BYTES = 256 * 1024 * 1024
MAX_ERROR_ANSWER_BYTES = 64 * 1024
ANSWER_TIME_S = 300.0
_READ_STEP = 1024 * 1024


def _read_answer(response: Any, limit: int, deadline: float) -> bytes:
    """At most `limit` bytes of `response` before `deadline` (monotonic), else
    ValueError (`_api`: "unexpected answer"). Read in steps: `read(limit)` would
    allocate `limit` at once."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise ValueError(f"the answer took more than {ANSWER_TIME_S:.0f} s")
        chunk = response.read1(_READ_STEP)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise ValueError(f"the answer is larger than {limit} bytes")
        chunks.append(chunk)


# The broker's 404s for a path outside its API (management/api.py, console.py), as
# opposed to a queue or message that is not there.
_NOT_THE_API_PREFIXES = ("no such endpoint", "no such console file")


def _api(url: Endpoint, path: str, body: dict[str, object] | None = None) -> object:
    """Call the broker's HTTP API; errors become one-line CommandErrors."""
    data = json.dumps(body).encode() if body is not None else None
    # POSTs carry the API's CSRF header (issue 24): the CLI is no cross-site page.
    headers = {"Content-Type": "application/json", "X-Requested-By": "amqpbroker-cli"}
    if data is None:
        headers = {}
    if url.authorization is not None:
        headers["Authorization"] = url.authorization
    try:
        request = urllib.request.Request(
            url.url.rstrip("/") + path,
            data=data,
            method="POST" if data is not None else "GET",
            headers=headers,
        )
        deadline = time.monotonic() + ANSWER_TIME_S
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(_read_answer(response, MAX_ANSWER_BYTES, deadline))
    except urllib.error.HTTPError as e:
        try:
            answer = _read_answer(e, MAX_ERROR_ANSWER_BYTES, deadline)
            message = json.loads(answer).get("error", e.reason)
        except (ValueError, AttributeError, RecursionError, OSError):
            message = e.reason
        finally:
            e.close()
        if e.code == 404 and (
            message == e.reason or str(message).startswith(_NOT_THE_API_PREFIXES)
        ):
            # Not the broker's API at this path (another service, a path the API is not
            # under): say what --url should be rather than only "Not Found".
            message = (
                f"{message}: no management API at {url}; --url is the broker's HTTP "
                f"address, http://HOST:PORT"
            )
        if e.code == 401:
            message = (
                f"authentication failed for user {url.user}"
                if url.user
                else f"authentication required: use --user or {USER_ENV}, or user:password@ "
                "in --url"
            )
        raise CommandError(f"{message} (HTTP {e.code})") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CommandError(f"cannot reach the broker at {url}: {reason}") from None
    except (ValueError, RecursionError) as e:  # a bad URL, an answer that is not JSON
        raise CommandError(f"unexpected answer from {url}: {e}") from None


def _table(rows: list[dict[str, object]], columns: list[str]) -> str:
    cells = [[_shown(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(widths[i]) for i, c in enumerate(columns))]
    for row in cells:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)))
    return "\n".join(lines)


def _checked(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A management command whose answer is not of the shape it reads (whatever `--url`
    names answered: another service, a hostile one) fails with one line, not with a
    KeyError or AssertionError traceback (sixth attack pass)."""

    @functools.wraps(command)
    def checked(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except (KeyError, TypeError, AttributeError, IndexError, AssertionError) as e:
            what = _shown(f"{type(e).__name__}: {e}")[:200]
            raise CommandError(f"unexpected answer from {args.url}: {what}") from None

    return checked


def _out(args: argparse.Namespace, value: object, human: str) -> None:
    print(json.dumps(value, indent=2) if args.json else human)  # noqa: T201


def _quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


@_checked
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


@_checked
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


def _read_ids(path: str) -> tuple[list[int], dict[str, dict[str, object]]]:
    """A redrive list: JSON lines with `msg_id` (and what the line says about the message,
    checked by the broker), or one id per line (CONTRACT)."""
    from amqpbroker.core.operations import EXPECT_FIELDS  # what the broker checks

    ids = []
    expect: dict[str, dict[str, object]] = {}
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
            msg_id = int(value["msg_id"] if isinstance(value, dict) else value)
        except (ValueError, KeyError, TypeError):
            raise CommandError(f"{path}:{number}: expected a msg_id: {line[:60]!r}") from None
        ids.append(msg_id)
        if isinstance(value, dict):
            fields = {k: value[k] for k in EXPECT_FIELDS if isinstance(value.get(k), str)}
            if fields:
                expect[str(msg_id)] = fields
    return ids, expect


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty() and total:
        width = 30
        filled = width * done // total
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        sys.stderr.flush()


@_checked
def _cmd_retry(args: argparse.Namespace) -> int:
    path = f"/api/v1/queues/{_quoted(args.queue)}/retry"
    ids, expect = _read_ids(args.ids) if args.ids else (None, {})
    body: dict[str, object] = {"filter": args.filter}
    if ids is not None:
        body["ids"] = ids
        if expect:
            body["expect"] = expect
    if args.rate is None:
        result = _api(args.url, path, body)
        assert isinstance(result, dict)
        _out(args, result, _retry_summary(args.queue, result))
        return 0
    # Throttled: a replay task on the broker (issue 24); follow its progress until done.
    body["rate"] = args.rate
    answer = _api(args.url, path, body)
    assert isinstance(answer, dict)
    started = answer["task"]
    sys.stderr.write(
        f"task {started['id']}: {started['total']} message(s) at {args.rate:g} msg/s; it runs "
        "on the broker (GET /api/v1/tasks/ID, POST /api/v1/tasks/ID/cancel)\n"
    )
    task = _follow_task(args.url, started)
    if task["status"] != "completed":
        raise CommandError(
            f"task {task['id']} {task['status']} at {task['done']}/{task['total']}"
            + (f": {task['error']}" if task.get("error") else "")
        )
    keys: tuple[str, ...] = ("retried", "skipped", "not_found")
    summary = {k: task[k] for k in keys if k in task}
    _out(args, summary, _retry_summary(args.queue, summary))
    return 0


TASK_POLL_S = 0.2


def _follow_task(url: Endpoint, task: dict[str, Any]) -> dict[str, Any]:
    """Poll a replay task until it is no longer running, drawing its progress bar. The
    task runs on the broker: interrupting the CLI does not stop it (cancel does)."""
    while task["status"] == "running":
        _progress(task["done"], task["total"])
        time.sleep(TASK_POLL_S)
        polled = _api(url, f"/api/v1/tasks/{_quoted(task['id'])}")
        assert isinstance(polled, dict)
        task = polled
    _progress(task["done"], task["total"])
    if sys.stderr.isatty() and task["total"]:
        sys.stderr.write("\n")
    return task


def _retry_summary(queue: str, result: dict[str, Any]) -> str:
    """`retried N message(s) from Q`, then every skipped id with why, and the ids the
    broker did not find waiting in Q."""
    lines = [f"retried {_shown(result['retried'])} message(s) from {queue}"]
    for entry in result.get("skipped", []):
        lines.append(f"skipped {_shown(entry['msg_id'])}: {_shown(entry['reason'])}")
    not_found = result.get("not_found", [])
    if not_found:
        lines.append(
            f"not found in {queue} ({len(not_found)}): " + " ".join(_shown(n) for n in not_found)
        )
    return "\n".join(lines)


@_checked
def _cmd_move(args: argparse.Namespace) -> int:
    result = _api(
        args.url,
        f"/api/v1/queues/{_quoted(args.queue)}/move",
        {"to-queue": args.to_queue, "filter": args.filter},
    )
    assert isinstance(result, dict)
    moved = _shown(result["moved"])
    _out(args, result, f"moved {moved} message(s) from {args.queue} to {args.to_queue}")
    return 0


@_checked
def _cmd_purge(args: argparse.Namespace) -> int:
    result = _api(args.url, f"/api/v1/queues/{_quoted(args.queue)}/purge", {"filter": args.filter})
    assert isinstance(result, dict)
    _out(args, result, f"removed {_shown(result['removed'])} message(s) from {args.queue}")
    return 0


def _cmd_certs_create(args: argparse.Namespace) -> int:
    from amqpbroker.security.certs import create_certificates

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


def _queue_name(text: str) -> str:
    """A QUEUE argument: an empty one reached the API as `/queues//purge` and came back as
    `/api/v1/queues/purge takes GET, HEAD (HTTP 405)` (user pass); now a usage error."""
    if not text:
        raise argparse.ArgumentTypeError("a queue name must not be empty")
    return text


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
        sub.add_argument(
            "--user",
            metavar="NAME",
            help=f"HTTP basic auth user (or {USER_ENV}, or user:password@ in --url: "
            "visible in `ps`); the password comes from --password-stdin, "
            f"{PASSWORD_ENV} or a prompt, never from an option",
        )
        sub.add_argument(
            "--password-stdin",
            action="store_true",
            help="read the password from the first line of standard input",
        )
        return sub

    queues = management("queues", "table of queues and their counters")
    queues.set_defaults(func=_cmd_queues)
    messages = management("messages", "browse messages of a queue (not consumed)")
    messages.add_argument("queue", metavar="QUEUE", type=_queue_name)
    messages.add_argument("--limit", type=int, default=20)
    messages.add_argument("--filter", metavar="SELECTOR")
    messages.set_defaults(func=_cmd_messages)
    retry = management("retry", "send dead-lettered/expired messages back to their address")
    retry.add_argument("queue", metavar="QUEUE", type=_queue_name)
    retry.add_argument("--filter", metavar="SELECTOR")
    retry.add_argument(
        "--ids", metavar="FILE", help="redrive list: JSON lines with msg_id, or one id per line"
    )
    retry.add_argument("--rate", type=float, metavar="N", help="at most N messages/s")
    retry.set_defaults(func=_cmd_retry)
    move = management("move", "move messages to another queue")
    move.add_argument("queue", metavar="QUEUE", type=_queue_name)
    move.add_argument("--to-queue", required=True, metavar="NAME", type=_queue_name)
    move.add_argument("--filter", metavar="SELECTOR")
    move.set_defaults(func=_cmd_move)
    purge = management("purge", "delete messages")
    purge.add_argument("queue", metavar="QUEUE", type=_queue_name)
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
    try:
        args = build_parser().parse_args(argv)
        try:
            if isinstance(getattr(args, "url", None), str):
                args.url = _endpoint(args)
            code: int = args.func(args)
        except CommandError as e:
            print(f"amqpbroker: {_shown(e)}", file=sys.stderr)  # noqa: T201
            return 1
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader went away (`amqpbroker queues | head -1`): stop quietly, as `cat`
        # does, with 1 (the output is incomplete). Point the standard streams at
        # /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # not a real file
                os.dup2(devnull, stream.fileno())
        return 1

"""Wiring: config -> Broker + listeners on one asyncio loop; start, serve, stop.

Threading model: one asyncio event loop owns the listening sockets, every connection's
Proton engine and the core `Broker`. Nothing else touches core state.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import gc
import ipaddress
import json
import logging
import os
import resource
import shutil
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from random import Random
from typing import Any

from amqpbroker import __version__
from amqpbroker.config import AcceptorConfig, BrokerConfig
from amqpbroker.core import (
    Broker,
    Clock,
    EventLevel,
    RoutingType,
    SettingsRepository,
    SystemClock,
)
from amqpbroker.core import operations as ops
from amqpbroker.core.diskguard import DiskGuard
from amqpbroker.core.management import MANAGEMENT_ADDRESS  # `manage` is granted there (B-154)
from amqpbroker.core.persistence import OnStored, Persistence
from amqpbroker.core.records import Record
from amqpbroker.core.security import SecurityRepository, source_keys
from amqpbroker.eventlog import EventLogWriter
from amqpbroker.management import (
    AmqpManagement,
    BasicAuth,
    HttpServer,
    LoopBridge,
    ManagementApi,
    tasks,
)
from amqpbroker.management.api import ConsoleContext
from amqpbroker.management.samples import Sampler
from amqpbroker.management.tasks import TaskFile, TaskRunner
from amqpbroker.metrics import BrokerCollector, BrokerSnapshot, render
from amqpbroker.metrics.collector import EventLogFiles, journal_sync_histogram
from amqpbroker.protocol import AmqpConnection, SaslFactory, Shell, message_of, moves
from amqpbroker.protocol.sasl import Credentials, Identity, Outcome, SaslServer, Verdict
from amqpbroker.security import (
    TlsFileError,
    acceptor_context,
    verify_password_or_dummy,
)
from amqpbroker.security.logins import PasswordChecks
from amqpbroker.store import idblock, sysmem
from amqpbroker.store.journal import FileJournal, JournalCorrupt, JournalError
from amqpbroker.store.paging import PageFiles
from amqpbroker.store.recovery import collector_paused, recover

log = logging.getLogger(__name__)

WRITE_HIGH_WATER_BYTES = 4 * 1024 * 1024
# A read of READ_AHEAD_MIN_BYTES or more is followed, in the same loop turn, by up to
# READ_AHEAD_MAX_READS more reads of the same socket, each handled and its output written
# before the next (issue 20, docs/decisions.md): a producer's burst is routed and
# delivered in one stretch, and the consumers' acknowledgements and the event-log frames
# of its first reads wait until it has been (they took ~25% of a 1,000-message burst's
# drain between its reads). Only while what a read brought in went out at once (at least
# half its size written to the sockets): when messages pile up instead (no consumer, or
# one out of credit), the other connections, whose input may be that credit, come first.
# At most 4 x 256 KiB from one connection before the others.
READ_AHEAD_MIN_BYTES = 16 * 1024
READ_AHEAD_MAX_READS = 3
# Group commit under heavy load, like Artemis's journal-buffer-timeout but only when 16 KiB
# or more wait for one writer pass (FileJournal.commit_delay_seconds): bench/durable.sh
# went from 9.4k to ~15.6k durable msg/s; a few synchronous senders never wait for it.
JOURNAL_COMMIT_DELAY_S = 0.02
# Proton engines are ticked at the deadline `transport.tick` returns (heartbeats owed to
# the peer, its idle-timeout), by one timer for all connections: at least every
# ENGINE_TICK_S, and never more often than ENGINE_MIN_TICK_S however small a peer's
# idle-timeout (a peer asking for heartbeats every millisecond does not get a busy loop).
ENGINE_TICK_S = 1.0
ENGINE_MIN_TICK_S = 0.05
# Descriptors kept free for the journal, the event log and the HTTP server: a new socket
# is closed at once when fewer than this remain below RLIMIT_NOFILE (issue 15 item 7); a
# quarter of a small limit, so that a broker under a tiny limit still takes connections.
# 64 for the broker's own files, and 64 for the sockets asyncio accepts past the line
# before the first it refuses is closed (seventh attack pass): `ACCEPT_BATCH` a loop turn,
# and a refused socket's descriptor is freed in the 4th turn after its accept (the
# accepting task, `connection_made`, `connection_lost`), 4 x 16 in all.
FD_RESERVE = 128
# Sockets asyncio accepts in one loop turn (create_server's `backlog`, which it also
# passes to listen()): with asyncio's 100, a burst of connections took the descriptors
# past the 64 of the reserve, every one of them (the seventh attack pass saw fd 399 of
# 400 taken: the journal's thread cannot open a segment then). The listen backlog stays
# LISTEN_BACKLOG; 16 a turn still accepts a burst of 1,000 in ~60 turns.
ACCEPT_BATCH = 16
LISTEN_BACKLOG = 100
REFUSED_LOG_PERIOD_S = 10.0  # at most one warning per period about refused connections
# Password checks (security/logins.py): threads beside the loop, and how many may wait.
PASSWORD_CHECK_WORKERS = max(1, min(4, (os.cpu_count() or 2) - 1))
PASSWORD_CHECKS_WAITING = 64  # ~4.5 s of queue at ~70 ms a check on one worker
# Allocations between young-generation collections (CPython's default is 700). In flight a
# message is a few dozen objects, alive for a group commit or an event-log frame (~10 ms):
# at 700 most are traversed and promoted, at 10,000 most die first (-8.5k instructions a
# durable message, ~3%). A young collection of 10,000 objects takes ~0.2 ms (timeit).
GC_YOUNG_THRESHOLD = 10_000
# The older generations (CPython: 10 and 10). A middle-generation collection walks every
# object that survived the young ones since the last: while a queue builds up, its new
# messages. CPython collects the middle generation at the young trigger after more than
# `threshold1` young collections: with 10, 12 x 10,000 allocations' worth, which took
# ~37 ms filling a queue, one stall a second (issue 20, docs/decisions.md). With 0 it is
# every 2nd trigger, 20,000 allocations' worth (~6-9 ms), six times as often: the same
# work. Full collections keep CPython's pace: (0 + 2) x (65 + 1) = (10 + 2) x (10 + 1)
# young triggers.
GC_MIDDLE_THRESHOLD = 0
GC_OLD_THRESHOLD = 65


def tune_gc() -> None:
    """Collect less often, and never again look at what exists once the broker has started.

    For the process that runs a broker (`amqpbroker run`), after `BrokerServer.start()`:
    `gc.freeze()` moves the start-up heap (modules, config, and every recovered message,
    maybe millions) out of the collector's sight, so a full collection no longer walks a
    deep recovered queue. They are still freed when their last reference goes. A message's
    path through the handler and the core makes no reference cycles (a test checks), so
    no garbage waits long for the rarer collections.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, GC_MIDDLE_THRESHOLD, GC_OLD_THRESHOLD)


def build_broker(
    config: BrokerConfig, *, clock: Clock | None = None, rng: Random | None = None
) -> Broker:
    """A Broker with the configured address-settings, addresses and queues."""
    settings = SettingsRepository(
        dict(config.address_settings), wildcards=config.wildcard_addresses
    )
    security = SecurityRepository(
        config.security.security_settings, wildcards=config.wildcard_addresses
    )
    broker = Broker(
        settings=settings,
        clock=clock or SystemClock(),
        rng=rng or Random(),
        copier=moves.COPIER,
        name=config.name,
        address_queue_scan_period_ms=config.address_queue_scan_period,
        message_expiry_scan_period_ms=config.message_expiry_scan_period,
        # The core builds only the events the configured level asks for (B-170).
        event_level=EventLevel(config.event_log.level)
        if config.event_log.enabled
        else EventLevel.OFF,
        security=security,
        id_cache_size=config.id_cache_size,
        global_max_size=config.global_max_size
        if config.global_max_size >= 0
        else sysmem.default_global_max_size(),
    )
    broker.management = AmqpManagement(broker)  # activemq.management (B-160)
    for address in config.addresses:
        types = set()
        if address.anycast or "ANYCAST" in address.routing_types:
            types.add(RoutingType.ANYCAST)
        if address.multicast or "MULTICAST" in address.routing_types:
            types.add(RoutingType.MULTICAST)
        broker.create_address(address.name, types or {RoutingType.MULTICAST})
        for routing_type, queues in (
            (RoutingType.ANYCAST, address.anycast),
            (RoutingType.MULTICAST, address.multicast),
        ):
            resolved = broker.settings_for(address.name)
            for q in queues:
                broker.create_queue(
                    q.queue_config(address.name, routing_type, defaults=resolved, configured=True)
                )
    return broker


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _peer_common_name(cert: dict[str, Any] | None) -> str | None:
    """The CN of a verified TLS client certificate (EXTERNAL), if any."""
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class StartupError(Exception):
    """The broker cannot start with this (valid) configuration; the message says why."""


def started_text(config: BrokerConfig, data_dir: Path) -> str:
    """The rest of the "started" line: where the data is and whether a client needs
    credentials (user pass: `make run` said neither)."""
    security = config.security
    if security.enabled:
        mechanisms = ", ".join(security.sasl_mechanisms)
        who = f"security enabled (SASL {mechanisms}; {len(security.users)} user(s))"
    else:
        who = "security disabled (no credentials: any client that reaches an acceptor may connect)"
    return f"data directory {data_dir.resolve()}, {who}"


def listen_error(what: str, key: str, host: str, port: int, error: OSError) -> StartupError:
    """A port the broker cannot listen on, as one line that names the listener, the
    address, why and the config key to change (user pass: asyncio's own text named
    neither, and the HTTP server's not even the address: `[Errno 98] Address already
    in use`)."""
    reason = error.strerror or str(error)
    if error.errno == errno.EADDRINUSE:
        reason = "address already in use (another broker or program listens there)"
    elif error.errno == errno.EACCES:
        reason = "permission denied (ports below 1024 need privileges)"
    elif error.errno == errno.EADDRNOTAVAIL:
        reason = "no such address on this machine"
    elif error.strerror is not None:
        reason = error.strerror[:1].lower() + error.strerror[1:]
    return StartupError(f"{what}: cannot listen on {host}:{port}: {reason}; change {key}")


# What a TLS client may send before its connection begins: the rest of the handshake's
# last read (an SSL record is at most 16 KiB; asyncio reads 256 KiB).
EARLY_TLS_BYTES = 512 * 1024


class _AmqpProtocol(asyncio.Protocol):
    """Bridges one socket to one `AmqpConnection`. Exceptions stop here: whatever goes
    wrong with one connection is logged and closes that connection only."""

    def __init__(
        self,
        server: BrokerServer,
        acceptor: AcceptorConfig,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.server = server
        self.acceptor = acceptor
        # amqps: the TLS handshake starts once the socket is admitted (`_start_tls`)
        self._tls = tls
        self._tls_task: asyncio.Task[None] | None = None
        self._admitted = False  # counted by `admit` until `connection_lost`
        self._early = bytearray()  # decrypted before the connection began (`_begin`)
        self.transport: asyncio.Transport | None = None
        self.amqp: AmqpConnection | None = None
        self.peer = "?"
        self._handshake_timer: asyncio.TimerHandle | None = None
        self.paused = False  # over the write high-water mark: take no more engine output
        self._auth_paused = False  # credentials being checked: input waits in the kernel
        # the per-source handshake counts this socket is in until its open (`admit`)
        self._handshake_keys: tuple[str, ...] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._handshake_keys = self.server.admit(
            self.acceptor, transport, self.peer, peer[0] if peer else ""
        )
        if self._handshake_keys is None:
            transport.abort()
            self.transport = None
            return
        self._admitted = True
        acceptor = self.acceptor
        if acceptor.handshake_timeout > 0:  # the TLS handshake, SASL and the open
            self._handshake_timer = asyncio.get_running_loop().call_later(
                acceptor.handshake_timeout, self._handshake_expired
            )
        if self._tls is not None:
            self._tls_task = asyncio.get_running_loop().create_task(
                self._start_tls(transport, self._tls)
            )
            return
        self._begin(transport)

    async def _start_tls(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        """The TLS handshake of an admitted socket (sixth attack pass): asyncio's own, in
        `create_server`, ran before the broker saw the socket, so sockets in it were
        counted by neither `handshakes-per-source` nor the descriptor reserve, and silent
        sockets on an amqps port held every descriptor (accept then failed with EMFILE,
        a traceback a try)."""
        timeout = self.acceptor.handshake_timeout
        try:
            tls = await asyncio.get_running_loop().start_tls(
                raw,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=timeout if timeout > 0 else None,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError, RuntimeError) as e:
            log.debug("TLS handshake from %s failed: %r", self.peer, e)
            self.connection_lost(None)  # whichever comes first cleans up (idempotent)
            return
        if not isinstance(tls, asyncio.Transport) or not self._admitted:  # lost meanwhile
            if tls is not None:
                tls.abort()
            return
        self.transport = tls
        self._begin(tls)

    def _begin(self, transport: asyncio.Transport) -> None:
        """The AMQP connection of an admitted socket (after its TLS handshake on amqps)."""
        peer = transport.get_extra_info("peername")
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)
        acceptor = self.acceptor
        self.amqp = AmqpConnection(
            self.server.shell,
            peer=self.peer,
            anycast_prefix=acceptor.anycast_prefix,
            multicast_prefix=acceptor.multicast_prefix,
            sasl=self.server.sasl_factory(
                transport, peer[0] if peer else "", after_check=self._check_finished
            ),
            reject_as_modified=acceptor.amqp_treat_reject_as_unmodified_delivery_failed,
            duplicate_detection=acceptor.amqp_duplicate_detection,
            idle_timeout_ms=max(acceptor.amqp_idle_timeout, 0),
            max_message_size=acceptor.max_message_size,
        )
        self.server.sockets[self.amqp] = self
        if self._early:
            early, self._early = bytes(self._early), bytearray()
            self.data_received(early)

    def data_received(self, data: bytes) -> None:
        amqp = self.amqp
        if amqp is None:
            if self._admitted and self._tls_task is not None:
                # Decrypted before `_start_tls` resumed (the handshake's last read may
                # hold the client's first bytes): kept for `_begin`, one read at most.
                self._early += data
                if len(self._early) > EARLY_TLS_BYTES and self.transport is not None:
                    self.transport.abort()
            return
        try:
            reads = 0
            while True:
                written = self.server.written_bytes
                amqp.feed(data)
                if amqp.awaiting_authentication and not self._auth_paused:
                    self._auth_paused = True
                    self._update_reading()
                self.server.flush()
                if (
                    len(data) < READ_AHEAD_MIN_BYTES
                    or reads == READ_AHEAD_MAX_READS
                    or 2 * (self.server.written_bytes - written) < len(data)
                    or not (data := self._read_ahead())
                ):
                    break
                reads += 1
        except Exception:
            self._internal_error("reading from")

    def _read_ahead(self) -> bytes:
        """What the socket holds now, without waiting; b"" when nothing, or when the loop
        must see the socket itself (end of file, an error), or when reading is paused, or
        on a TLS connection (the loop's transport decrypts)."""
        transport = self.transport
        if (
            self.amqp is None
            or self.paused
            or self._auth_paused
            or transport is None
            or transport.is_closing()
            or not transport.is_reading()
        ):
            return b""
        sock = getattr(transport, "_sock", None)  # a plain socket transport's own socket
        if not isinstance(sock, socket.socket):
            return b""
        try:
            return sock.recv(getattr(transport, "max_size", 256 * 1024))
        except OSError:  # nothing waiting (EAGAIN), or an error the loop's next read gets
            return b""

    def _check_finished(self) -> None:
        """A credentials check ended (later, on the loop): write the outcome, read again."""
        try:
            self._auth_paused = False
            self._update_reading()
            self.server.flush()
        except Exception:
            self._internal_error("authenticating")

    def _internal_error(self, doing: str) -> None:
        """The last-resort boundary: log, then drop this connection only."""
        log.exception(
            "internal error %s connection %s from %s: closing it",
            doing,
            self.amqp.id if self.amqp is not None else "-",
            self.peer,
        )
        if self.transport is not None:
            self.transport.abort()  # connection_lost follows and cleans up

    def opened(self) -> None:
        """The peer's AMQP open arrived: the handshake is over."""
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self._end_handshake()

    def _end_handshake(self) -> None:
        keys, self._handshake_keys = self._handshake_keys, None
        if keys:
            self.server.handshake_over(keys)

    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        amqp = self.amqp
        if not self._admitted or self.transport is None or (amqp is not None and amqp.opened):
            return
        self.server.count_refused("handshake-timeout")
        log.info(
            "closing connection %s from %s: no AMQP open within handshake-timeout=%d s",
            "(TLS handshake)" if amqp is None else amqp.id,
            self.peer,
            self.acceptor.handshake_timeout,
        )
        self.transport.abort()

    def eof_received(self) -> bool | None:
        return None  # close the socket; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self._end_handshake()
        if not self._admitted:
            return
        self._admitted = False
        self.server.release(self.acceptor)
        amqp = self.amqp
        if amqp is None:  # lost in the TLS handshake
            return
        self.server.sockets.pop(amqp, None)
        try:
            amqp.socket_closed()
            self.server.flush()
        except Exception:
            log.exception("internal error closing connection %s from %s", amqp.id, self.peer)
        self.amqp = None
        # Issue 23: the engine's buffers of the transfers it dropped go with it.
        self.server.memory.released(amqp.transfers.dropped_bytes)

    def pause_writing(self) -> None:
        # The peer reads slower than we write: stop reading from it until it catches up,
        # so neither its transfers nor our dispositions pile up in memory.
        self.paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.paused = False
        self._update_reading()
        if self.amqp is not None:  # the engine may hold more output: write it now
            self.server.shell.dirty.add(self.amqp)
            self.server.flush()

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.paused or self._auth_paused:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class BrokerServer:
    """The running broker: listeners, engines, timers. Loop thread only."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        data_dir: Path,
        clock: Clock | None = None,
        rng: Random | None = None,
        skip_corrupt_journal: bool = False,
    ) -> None:
        self.config = config
        self.data_dir = data_dir
        self.skip_corrupt_journal = skip_corrupt_journal
        # Freeze the recovered heap out of the collector's sight (`collector_paused`): the
        # broker process sets it (`amqpbroker run`, which `tune_gc`s); tests do not.
        self.freeze_recovered = False
        self.journal: FileJournal | None = None
        self.journal_sync = journal_sync_histogram()
        self.broker = build_broker(config, clock=clock, rng=rng)
        self.shell: Shell[AmqpConnection] = Shell(self.broker)
        self.event_log: EventLogWriter | None = None
        if self.broker.emitter.failures:  # some level of the event log is on
            self.event_log = EventLogWriter(
                data_dir / "events",
                broker_name=config.name,
                config=config.event_log,
            )
            self.broker.emitter.data_limit = self.event_log.data_limit
            self.broker.emitter.heads_only = self.event_log.heads_only
            self.broker.emitter.known_window = self.event_log.known_window
            self.event_log.on_drop = self.broker.emitter.forget_sent
            self.shell.event_sink = self.event_log.submit
        users = config.security.users
        self.shell.roles_for = lambda user: (
            frozenset(users[user].roles) if user in users else frozenset()
        )
        self.shell.on_opened = self._on_opened
        self.sockets: dict[AmqpConnection, _AmqpProtocol] = {}
        self.written_bytes = 0  # by `flush`, to every socket: read-ahead's measure
        self.ports: dict[str, int] = {}
        self._servers: list[asyncio.Server] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at_ms: int | None = None
        self._engine_timer: asyncio.TimerHandle | None = None
        self._engine_timer_at_s = 0.0
        self.password_checks: PasswordChecks | None = None
        self._connections_per_acceptor: dict[str, int] = {}
        self.refused: dict[str, int] = {}  # reason -> connections closed at once, in total
        # "acceptor source-key" -> its sockets before the AMQP open (`admit`); a key leaves
        # when its count is 0, so the map holds at most twice the sockets open
        self._handshaking: dict[str, int] = {}
        self._refused_unlogged = 0
        self._refused_logged_at_s = -REFUSED_LOG_PERIOD_S
        self._accept_error_logged_at_s = -REFUSED_LOG_PERIOD_S  # `_loop_error`
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._fd_limit = None if soft == resource.RLIM_INFINITY else soft
        self.http: HttpServer | None = None
        self.tasks: TaskRunner | None = None
        self.sampler = Sampler()  # the console's rates and charts (issue 24)
        self.tasks_file: TaskFile | None = None
        self._sampler_timer: asyncio.TimerHandle | None = None
        self._started_s = time.monotonic()
        self._accepting = False
        self._stopped = asyncio.Event()
        self.pages: PageFiles | None = None  # B-151 PAGE: DATA_DIR/paging
        self.memory = sysmem.MemoryReturner()  # issue 23: freed heap back to the system

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._loop_error)
        if self.config.persistence.enabled:
            self._open_journal(loop)
        else:
            self._refuse_to_drop_durable_pages()
            pages = self.pages = self._page_files()
            pages.recover({}, {})  # memory only: nothing paged survives a restart
            self.broker.enable_paging(pages)
        self._reserve_message_ids()
        if self.config.security.enabled:
            self.password_checks = PasswordChecks(
                loop, workers=PASSWORD_CHECK_WORKERS, max_waiting=PASSWORD_CHECKS_WAITING
            )
        for acceptor in self.config.acceptors:
            context = None
            if acceptor.tls is not None:
                try:
                    context = acceptor_context(acceptor.name, acceptor.tls)
                except TlsFileError as e:
                    raise StartupError(str(e)) from e
            try:
                server = await loop.create_server(
                    # TLS is started by the protocol once the socket is admitted (`_start_tls`)
                    functools.partial(_AmqpProtocol, self, acceptor, context),
                    acceptor.host,
                    acceptor.port,
                    reuse_address=True,
                    backlog=ACCEPT_BATCH,
                )
            except OSError as e:
                what = f"acceptor {acceptor.name}"
                raise listen_error(what, "acceptors[].url", acceptor.host, acceptor.port, e) from e
            for listening in server.sockets:  # the same socket: its backlog (Linux)
                with listening.dup() as same:
                    same.listen(LISTEN_BACKLOG)
            self._servers.append(server)
            port = server.sockets[0].getsockname()[1]
            self.ports[acceptor.name] = port
            log.info(
                "acceptor %s listening on %s://%s:%d",
                acceptor.name,
                acceptor.scheme,
                acceptor.host,
                port,
            )
        if self.event_log is not None:
            # A frame at the end of every loop turn with events; call_later retries a full pipe.
            self.event_log.start(schedule=loop.call_later, soon=loop.call_soon)
        if self.config.http.enabled:
            await self._start_http(loop)
        self._accepting = True
        self._write_ports()
        self._schedule_engine_tick(loop.time() + ENGINE_TICK_S)
        self._schedule_tick()
        log.info(
            "broker %s started: %s", self.broker.name, started_text(self.config, self.data_dir)
        )

    def _refuse_to_drop_durable_pages(self) -> None:
        """Without persistence the page files are memory's overflow and a start deletes
        them; a journal next to them means a persistent run paged durable messages there
        (they come back only with their journal). One start with `persistence.enabled:
        false` must not delete them silently (crash pass, docs/decisions.md)."""
        journal = self.data_dir / "journal"
        paging = self.data_dir / "paging"
        if not any(journal.glob("journal-*.seg")):
            return
        pages = sum(1 for _ in paging.rglob("*.page")) if paging.is_dir() else 0
        if pages:
            raise StartupError(
                f"{paging} holds {pages} page file(s) of a persistent run (its journal is "
                f"{journal}); persistence.enabled: false would delete them. Enable "
                "persistence, or use another data directory"
            )
        log.warning("%s is not read: persistence.enabled is false", journal)

    def _reserve_message_ids(self) -> None:
        """Message ids from durably reserved blocks, above any a previous run used (issue
        16 item 2): after recovery, which puts the journal's largest id under them."""
        path = self.data_dir / idblock.FILE_NAME
        ids = self.broker.message_ids
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            reserved = idblock.read_reserved(path)
        except idblock.IdBlockError as e:
            raise StartupError(
                f"{e}. It holds where new message ids start: restore it from a backup, or "
                "remove it (ids then start above the journal's largest and may repeat ids "
                "named in older event logs)"
            ) from e
        except OSError as e:
            raise StartupError(f"cannot reserve message ids in {path}: {e}") from e
        try:
            ids.reserve_with(functools.partial(idblock.write_reserved, path), reserved)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise StartupError(f"cannot reserve message ids in {path}: {e}") from e
            # A full disk is no reason to stay down: consumers must be able to drain
            # what is stored, which frees it (crash pass, docs/decisions.md). Sends are
            # refused until a block is reserved, as when a block runs out while running.
            ids.wait_for_room()
            log.warning(
                "cannot reserve message ids in %s (%s): sends are refused until the disk has room",
                path,
                e.strerror,
            )

    def _page_files(self) -> PageFiles:
        """B-151 PAGE: page files under DATA_DIR/paging (store/paging.py)."""
        settings = self.broker.settings
        return PageFiles(
            self.data_dir / "paging",
            message_of=message_of,
            page_size_bytes=lambda address: settings.resolve(address).page_size_bytes,
            sync=self.config.persistence.sync,
        )

    def _open_journal(self, loop: asyncio.AbstractEventLoop) -> None:
        """Recover from DATA_DIR/journal before any client can connect (issue 5)."""
        with collector_paused(freeze=self.freeze_recovered):  # issue 23 item 4
            self._recover_journal(loop)

    def _recover_journal(self, loop: asyncio.AbstractEventLoop) -> None:
        directory = self.data_dir / "journal"
        started = time.monotonic()
        try:
            journal = FileJournal(
                directory,
                skip_corrupt=self.skip_corrupt_journal,
                sync_seconds=self.journal_sync.observe,
                commit_delay_seconds=JOURNAL_COMMIT_DELAY_S,
                # issue 23: bodies past global-max-size stay in the journal (`recover`)
                body_budget=self.broker.global_max_size,
            )
        except JournalCorrupt as e:
            raise StartupError(
                f"{e}. The broker does not start on a corrupt journal: keep a copy of "
                f"{directory}, then start with --skip-corrupt-journal to drop the bad "
                "records (what they held is lost), or restore a backup"
            ) from e
        except JournalError as e:
            raise StartupError(f"journal {directory}: {e}") from e
        self.journal = journal
        state = journal.state()
        settings = self.config.persistence
        persistence = Persistence(
            LoopJournal(journal, loop, after=self._after_command),
            sync=settings.sync,
            max_redelivery_records=self.config.max_redelivery_records,
            before_delivery=settings.persist_delivery_count_before_delivery,
        )
        self.broker.enable_persistence(persistence)
        self._guard_disk(persistence)
        recovered = recover(
            self.broker,
            state,
            message_of,
            read=journal.read_message,
            budget=self.broker.global_max_size,
        )
        pages = self.pages = self._page_files()
        durable = {q.name: q.address for q in self.broker.queues.values() if q.store is not None}
        found = pages.recover(durable, state.page_cursors, state.page_skips, state.page_commits)
        self.broker.enable_paging(pages, paged=tuple(found))
        persistence.before_flush = pages.flush
        persistence.flush()
        log.info(
            "journal %s: recovered %d messages (%d references) in %d queues in %.2f s",
            directory,
            recovered.messages,
            recovered.refs,
            len(self.broker.queues),
            time.monotonic() - started,
        )

    async def _start_http(self, loop: asyncio.AbstractEventLoop) -> None:
        bridge = LoopBridge(
            loop, after=self._after_command, after_slice=self._after_slice, walked=self._after_walk
        )
        collector = BrokerCollector(
            lambda: bridge.call(self.snapshot), artemis_names=self.config.metrics.artemis_names
        )
        http = self.config.http
        self.tasks_file = TaskFile(self.data_dir / tasks.FILE_NAME)
        self.tasks = TaskRunner(
            self.broker,
            now=time.monotonic,
            call_later=loop.call_later,
            save=self.tasks_file.save,
            after=self._after_command,
        )
        self.tasks.resume(self.tasks_file.load())
        self._sample()
        api = ManagementApi(
            bridge,
            metrics=lambda: render(collector),
            healthy=lambda: self._accepting,
            auth=self._http_auth(bridge) if self.config.security.enabled else None,
            console=ConsoleContext(
                info=self._console_info,
                sampler=self.sampler,
                tasks=self.tasks,
                analyze_report=http.analyze_report,
                sample_interval_s=http.sample_interval / 1000,
            ),
        )
        api.bridge_broker = self.broker
        try:
            self.http = await loop.run_in_executor(
                None,
                functools.partial(
                    HttpServer,
                    http.host,
                    http.port,
                    api,
                    read_timeout_s=http.read_timeout / 1000,
                    max_connections=http.max_connections,
                    fd_ceiling=self._http_fd_ceiling(),
                ),
            )
        except OSError as e:
            raise listen_error("HTTP", "http.bind", http.host, http.port, e) from e
        self.http.start()
        self.ports["http"] = self.http.port
        log.info(
            "HTTP (metrics, health, management API, console at /console/) on http://%s:%d",
            http.host,
            self.http.port,
        )

    def _sample(self) -> None:
        """Record the queues for the console's rates and charts, then again later."""
        self.sampler.take(time.time(), ops.queue_stats(self.broker))
        self._sampler_timer = asyncio.get_running_loop().call_later(
            self.config.http.sample_interval / 1000, self._sample
        )

    def _console_info(self) -> dict[str, Any]:
        """The console's header: loop thread only."""
        return {
            "name": self.broker.name,
            "version": __version__,
            "uptime_s": time.monotonic() - self._started_s,
            "now_ms": self.broker.clock.now_ms(),
            "connections": len(self.shell.connections),
            "queues": len(self.broker.queues),
            "addresses": len(self.broker.post_office.addresses),
        }

    def _http_auth(self, bridge: LoopBridge) -> BasicAuth:
        """HTTP basic auth for /api/v1 and /console: a configured user with `browse` to
        read, `manage` for the rest (CONTRACT, issue 24)."""
        users = self.config.security.users

        def verify(user: str, password: str) -> bool:
            known = users.get(user)
            return verify_password_or_dummy(password, known.password_hash if known else None)

        def permitted(user: str, permission: str) -> bool:
            roles = frozenset(users[user].roles) if user in users else frozenset()
            # The security repository caches per address: read it on the loop only.
            return bridge.call(
                lambda: self.broker.security.allowed(roles, permission, MANAGEMENT_ADDRESS)
            )

        return BasicAuth(verify=verify, permitted=permitted)

    def sasl_factory(
        self,
        transport: asyncio.Transport,
        peer_host: str,
        *,
        after_check: Callable[[], None] = lambda: None,
    ) -> SaslFactory | None:
        """The SASL layer for a new connection, or None when security is disabled.

        `after_check` runs on the loop when a password check ends (the outcome is then
        ready to write and the socket may be read again)."""
        security = self.config.security
        if not security.enabled:
            return None
        tls = transport.get_extra_info("ssl_object")
        peer_cn = _peer_common_name(tls.getpeercert() if tls is not None else None)
        offered = []
        for mechanism in security.sasl_mechanisms:
            if (
                mechanism == "PLAIN"
                and tls is None
                and not _is_loopback(peer_host)
                and not security.allow_plain_without_tls
            ):
                continue  # never ask for a password in clear over the network
            if mechanism == "EXTERNAL" and peer_cn is None:
                continue
            offered.append(mechanism)
        users = security.users
        checks = self.password_checks

        def verify(credentials: Credentials, done: Callable[[Verdict], None]) -> Callable[[], None]:
            if credentials.mechanism == "EXTERNAL":
                cn = credentials.peer_cn
                done(cn if cn is not None and cn in users else Outcome.AUTH)
                return lambda: None
            name, password = credentials.authcid, credentials.password
            if checks is None or name is None or password is None:
                done(Outcome.SYS)
                return lambda: None
            user = users.get(name)

            def checked(ok: bool | None) -> None:
                if ok is None:
                    done(Outcome.SYS_TEMP)
                else:
                    done(name if ok else Outcome.AUTH)
                after_check()

            # An unknown user costs a full check too (no enumeration by timing).
            return checks.check(
                peer_host, password, user.password_hash if user is not None else None, checked
            )

        def make(
            authenticated: Callable[[Identity, bytes], None], failed: Callable[[str], None]
        ) -> SaslServer:
            return SaslServer(
                mechanisms=tuple(offered),
                verify=verify,
                peer_cn=peer_cn,
                on_authenticated=authenticated,
                on_failure=failed,
            )

        return make

    def _guard_disk(self, persistence: Persistence) -> None:
        """Artemis max-disk-usage: the broker's tick measures the data directory's file
        system every disk-scan-period ms (core/diskguard.py); checked once now, so that a
        broker started on a full disk refuses durable sends from its first client."""
        if self.config.max_disk_usage < 0:
            return
        data_dir = self.data_dir

        def read_usage() -> tuple[int, int]:
            usage = shutil.disk_usage(data_dir)  # as Artemis: 1 - usable / total
            return usage.total - usage.free, usage.total

        guard = DiskGuard(
            max_usage_percent=self.config.max_disk_usage,
            period_ms=self.config.disk_scan_period,
            read_usage=read_usage,
            persistence=persistence,
            now_ms=self.broker.clock.now_ms(),
        )
        guard.check(guard.next_check_ms)
        self.broker.disk_guard = guard
        persistence.note_written = guard.note_written  # its appends, between scans

    def snapshot(self) -> BrokerSnapshot:
        """Metrics snapshot; loop thread only."""
        return BrokerSnapshot.take(
            self.broker,
            connections=len(self.shell.connections),
            connections_opened=self.shell.opened_total,
            authentication_failures=self.shell.auth_failures,
            event_log_dropped=self.event_log.dropped_total if self.event_log else 0,
            event_log_pending=self.event_log.pending_events if self.event_log else 0,
            journal_size_bytes=self.journal.size_bytes if self.journal else 0,
            journal_sync=self.journal_sync,
            event_log_files=EventLogFiles(*self.event_log.disk) if self.event_log else None,
            now_ms=time.time_ns() // 1_000_000,  # file times are wall-clock, whatever the broker's
            journal_failed=self.journal is not None and self.journal.failure is not None,
            journal_errors=self.journal.errors if self.journal else 0,
            connections_refused=self.refused,
        )

    def _after_command(self) -> None:
        self._after_slice()
        self.memory.check(self.broker.memory_bytes)  # a purge may have freed a lot

    def _after_slice(self) -> None:
        """After a slice of a management walk: no memory check, since what the walk
        took is freed when it ends (`_after_walk`; a trim in between gives nothing)."""
        self.shell.apply_effects()
        self.flush()

    def _after_walk(self) -> None:
        self.memory.check(self.broker.memory_bytes, ended=True)  # issue 23: a purge's

    def _write_ports(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / "ports.json"
        tmp = path.with_suffix(".json.tmp")
        try:
            tmp.write_text(json.dumps(self.ports) + "\n")
            os.replace(tmp, path)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise StartupError(f"cannot write {path}: {e}") from e
            # Informational only (the ports are in the log too): a full disk must not
            # keep the broker down (crash pass).
            log.warning("cannot write %s (%s): the ports are in the lines above", path, e)

    # -- flushing and timers ----------------------------------------------------------
    def flush(self) -> None:
        """Write what every touched engine has to say; close finished sockets."""
        shell = self.shell
        while shell.dirty:
            dirty = list(shell.dirty)
            shell.dirty.clear()
            for amqp in dirty:
                sock = self.sockets.get(amqp)
                if sock is None:
                    amqp.output()
                    continue
                # Until the engine has nothing more, or the socket is over its high-water
                # mark: resume_writing() flushes the rest (issue 16 item 1).
                while not sock.paused and (out := amqp.output()):
                    sock.write(out)
                    self.written_bytes += len(out)
                if amqp.finished:
                    sock.close()
        self._schedule_tick()

    def _schedule_tick(self) -> None:
        deadline_ms = self.broker.next_deadline_ms()
        if deadline_ms is None or deadline_ms == self._timer_at_ms:
            return
        if self._timer is not None:
            self._timer.cancel()
        delay_s = max(0.0, (deadline_ms - self.broker.clock.now_ms()) / 1000)
        self._timer_at_ms = deadline_ms
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at_ms = None
        self.run_tick()

    def run_tick(self) -> None:
        """Fire due redeliveries and the reaper, then flush what they dispatched."""
        self.broker.tick()
        self.shell.apply_effects()
        self.flush()

    # -- connections: admission, heartbeats ------------------------------------------
    def admit(
        self, acceptor: AcceptorConfig, transport: asyncio.Transport, peer: str, host: str
    ) -> tuple[str, ...] | None:
        """Whether a new socket may become a connection (issue 15 item 7): the acceptor's
        connections-allowed, its handshakes-per-source (fourth attack pass), and a
        reserve of descriptors for the journal and the rest. None: refused; else the
        per-source handshake keys the socket now counts against (`handshake_over`)."""
        count = self._connections_per_acceptor.get(acceptor.name, 0)
        if 0 < acceptor.connections_allowed <= count:
            self.count_refused("connections-allowed", peer=peer, acceptor=acceptor.name)
            return None
        sock = transport.get_extra_info("socket")
        limit = self._fd_limit
        reserve = min(FD_RESERVE, limit // 4) if limit is not None else 0
        if sock is not None and limit is not None and sock.fileno() >= limit - reserve:
            # Descriptors are allocated lowest first: fd k open means k are in use.
            self.count_refused("file-descriptors", peer=peer, acceptor=acceptor.name)
            return None
        keys: tuple[str, ...] = ()
        per_source = acceptor.handshakes_per_source
        if per_source > 0 and host:
            weighted = [(f"{acceptor.name} {k}", w) for k, w in source_keys(host)]
            handshaking = self._handshaking
            if any(handshaking.get(k, 0) >= per_source * w for k, w in weighted):
                self.count_refused("handshakes-per-source", peer=peer, acceptor=acceptor.name)
                return None
            keys = tuple(k for k, _ in weighted)
            for k in keys:
                handshaking[k] = handshaking.get(k, 0) + 1
        self._connections_per_acceptor[acceptor.name] = count + 1
        return keys

    def _http_fd_ceiling(self) -> int | None:
        """The first descriptor an HTTP connection may not have: the AMQP acceptors stop
        at `limit - reserve` (`admit`), HTTP at the half of the reserve that is the
        broker's own files' (FD_RESERVE), so that idle HTTP connections, which the
        acceptors' check never saw, cannot take what the journal needs to roll a
        segment (docs/decisions.md "Loose ends")."""
        limit = self._fd_limit
        if limit is None:
            return None
        return limit - min(FD_RESERVE, limit // 4) // 2

    def handshake_over(self, keys: tuple[str, ...]) -> None:
        """A socket counted by `admit` opened or closed: its source may start another."""
        handshaking = self._handshaking
        for k in keys:
            left = handshaking.get(k, 0) - 1
            if left > 0:
                handshaking[k] = left
            else:
                handshaking.pop(k, None)

    def release(self, acceptor: AcceptorConfig) -> None:
        self._connections_per_acceptor[acceptor.name] -= 1

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio's own error reports. An accept that found no descriptor (EMFILE: a
        burst of sockets past the reserve, which `admit` closes only after asyncio has
        accepted a batch of up to 100) was an ERROR with a traceback per try, hundreds a
        second under a flood of connections (sixth attack pass): it is one warning per
        period. The connection waits in the listen backlog; asyncio retries in 1 s."""
        error = context.get("exception")
        if context.get("message") == "socket.accept() out of system resource" and isinstance(
            error, OSError
        ):
            now_s = time.monotonic()
            if now_s - self._accept_error_logged_at_s >= REFUSED_LOG_PERIOD_S:
                self._accept_error_logged_at_s = now_s
                log.warning(
                    "cannot accept connections: %s (retried every second; open-files limit %s)",
                    os.strerror(error.errno) if error.errno else error,
                    self._fd_limit,
                )
            return
        loop.default_exception_handler(context)

    def count_refused(self, reason: str, *, peer: str = "", acceptor: str = "") -> None:
        """Count a connection closed by a limit; warn at most once per period."""
        self.refused[reason] = self.refused.get(reason, 0) + 1
        if reason == "handshake-timeout":
            return  # logged per connection at info level
        self._refused_unlogged += 1
        now_s = time.monotonic()
        if now_s - self._refused_logged_at_s >= REFUSED_LOG_PERIOD_S:
            log.warning(
                "refused %d connection(s) in the last %.0f s, the latest from %s on acceptor "
                "%s: %s limit reached (totals: %s)",
                self._refused_unlogged,
                min(now_s - self._refused_logged_at_s, REFUSED_LOG_PERIOD_S),
                peer,
                acceptor,
                reason,
                ", ".join(f"{k}={v}" for k, v in sorted(self.refused.items())),
            )
            self._refused_unlogged = 0
            self._refused_logged_at_s = now_s

    def _on_opened(self, amqp: AmqpConnection) -> None:
        """An AMQP open arrived: end the handshake timer, tick for the first deadline
        (the peer's idle-timeout sets when heartbeats are due)."""
        sock = self.sockets.get(amqp)
        if sock is not None:
            sock.opened()
        now_s = asyncio.get_running_loop().time()
        amqp.tick_at_s = amqp.transport.tick(now_s)
        if amqp.tick_at_s and amqp.tick_at_s < self._engine_timer_at_s:
            self._schedule_engine_tick(amqp.tick_at_s)

    def _schedule_engine_tick(self, at_s: float) -> None:
        loop = asyncio.get_running_loop()
        at_s = max(at_s, loop.time() + ENGINE_MIN_TICK_S)
        if self._engine_timer is not None:
            self._engine_timer.cancel()
        self._engine_timer_at_s = at_s
        self._engine_timer = loop.call_at(at_s, self._tick_engines)

    def _tick_engines(self) -> None:
        """Tick the engines whose deadline has come (one timer for all connections):
        heartbeats go out, and a peer silent for the idle-timeout is dropped (B-054)."""
        self._engine_timer = None
        now_s = asyncio.get_running_loop().time()
        next_s = now_s + ENGINE_TICK_S
        failed = []
        for amqp in list(self.sockets):
            at_s = amqp.tick_at_s
            if not at_s:
                continue
            if at_s <= now_s + 0.001:
                try:
                    at_s = amqp.tick_at_s = amqp.transport.tick(now_s)
                    amqp.process()
                except Exception:
                    log.exception("internal error ticking connection %s: closing it", amqp.id)
                    failed.append(amqp)
            if at_s:
                next_s = min(next_s, at_s)
        self.flush()  # heartbeats; an expired connection's close frame, then its socket
        self.memory.check(self.broker.memory_bytes)  # issue 23: a drain freed a lot?
        for amqp in failed:
            sock = self.sockets.get(amqp)
            if sock is not None:
                sock.close()
        self._schedule_engine_tick(next_s)

    # -- stopping ---------------------------------------------------------------------
    async def stop(self) -> None:
        """Stop accepting, close every connection with an AMQP close, release sockets."""
        self._accepting = False
        for server in self._servers:
            server.close()
        if self.http is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.http.stop)
        if self._sampler_timer is not None:
            self._sampler_timer.cancel()
        if self.tasks is not None and self.tasks_file is not None:
            self.tasks.stop()  # running tasks resume at the next start
            await asyncio.get_running_loop().run_in_executor(None, self.tasks_file.close)
        for amqp in list(self.sockets):
            if not amqp.closed:
                amqp.connection.close()
                amqp.process()
        self.flush()
        for sock in list(self.sockets.values()):
            sock.close()
        for server in self._servers:
            await server.wait_closed()
        if self._engine_timer is not None:
            self._engine_timer.cancel()
        if self.password_checks is not None:
            self.password_checks.close()
        if self._timer is not None:
            self._timer.cancel()
        if self.event_log is not None:
            self.shell.apply_effects()  # hand over the last events
            self.event_log.seal()  # later ones are counted as dropped; close() waits
            await asyncio.get_running_loop().run_in_executor(None, self.event_log.close)
        if self.journal is not None:
            self.shell.apply_effects()  # the last durable changes
            journal = self.journal
            await asyncio.get_running_loop().run_in_executor(None, journal.close)
        if self.pages is not None:
            self.pages.close()
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / "ports.json").unlink()
        self._stopped.set()
        log.info("broker %s stopped", self.broker.name)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


class LoopJournal:
    """A `FileJournal` whose `on_durable` callbacks run on the event loop, batched.

    Loop wiring, so it lives with the server: `store/` knows no event loop (issue 18).

    The journal's writer thread calls back once per append; this posts them to the loop
    with one `call_soon_threadsafe` per writer pass instead of one per append.
    """

    def __init__(
        self,
        journal: FileJournal,
        loop: asyncio.AbstractEventLoop,
        *,
        after: Callable[[], None] = lambda: None,
    ) -> None:
        self.journal = journal
        self._loop = loop
        self._after = after  # e.g. write the settlements out to the sockets
        self._ready: list[tuple[OnStored, BaseException | None]] = []
        self._posted = False

    def append(
        self, records: Sequence[Record], *, sync: bool, on_durable: OnStored | None = None
    ) -> None:
        if on_durable is None:
            self.journal.append(records, sync=sync)
            return

        def durable(error: BaseException | None) -> None:  # writer thread
            self._ready.append((on_durable, error))
            if not self._posted:
                self._posted = True
                self._loop.call_soon_threadsafe(self._run)

        self.journal.append(records, sync=sync, on_durable=durable)

    def on_resume(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the loop each time the journal works again."""

        def resumed() -> None:  # writer thread
            self._loop.call_soon_threadsafe(callback)

        self.journal.on_resume(resumed)

    def _run(self) -> None:
        self._posted = False  # before taking: a later append posts again
        ready, self._ready = self._ready, []
        for callback, error in ready:
            callback(error)
        self._after()

"""Command-line options of `python -m storage_node`, parsed and validated once."""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib

from metadata import layout
from metadata.store import METADATA_ENV, MetadataUri
from protos.pem import CERTIFICATE, PRIVATE_KEY, missing_pem
from storage_node.errors import ConfigError

MiB = 1 << 20
MAX_CONCURRENT_RPCS = 10_000    # calls and streams served at once (grpc's maximum_concurrent_rpcs)
MAX_LAC_WAITERS = 4_096         # WaitLac long polls waiting at once
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# The longest the node's periodic work waits between rounds (checkpoints, disk checks, garbage collection) and its gc
# grace: far past any useful setting, and a bound that keeps 1e300 out of the sleeps and the arithmetic.
MAX_INTERVAL = 7 * 86400.0                    # a week
MAX_OVERREPLICATED_INTERVAL = 30 * 86400.0    # a month: a check reads the metadata of every ledger the node holds
_AT_MOST = f"at most {MAX_INTERVAL:.0f} (a week)"
# A ZooKeeper session timeout of 1e300 s broke kazoo's connection thread; servers cap it anyway (maxSessionTimeout,
# 40 s by default).
MAX_SESSION_TIMEOUT = 3600.0                  # an hour


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    data_dir: pathlib.Path
    port: int
    metadata: str
    node_id: str
    host: str = "127.0.0.1"
    max_entry_bytes: int = 8 * MiB
    read_only_threshold: float = 0.95
    disk_quota_bytes: int = 0
    read_only: bool = False
    checkpoint_interval: float = 60.0
    disk_check_interval: float = 1.0
    zk_session_timeout: float = 10.0
    journal_segment_bytes: int = 512 * MiB
    journal_page_cache_bytes: int = 0
    gc_interval: float = 300.0
    gc_grace: float = 300.0
    gc_overreplicated_interval: float = 86400.0
    compaction_threshold: float = 0.5
    max_concurrent_rpcs: int = MAX_CONCURRENT_RPCS
    max_lac_waiters: int = MAX_LAC_WAITERS
    metrics_port: int = 0
    tls_cert: pathlib.Path | None = None
    tls_key: pathlib.Path | None = None
    tls_ca: pathlib.Path | None = None
    auth_token_file: pathlib.Path | None = None
    bind_keys_unchecked: bool = False
    log_level: str = "INFO"
    ready_file: pathlib.Path | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def max_request_bytes(self) -> int:
        """gRPC receive limit: room for a batch of several maximal entries (oversized ones get BAD_REQUEST)."""
        return 4 * self.max_entry_bytes + MiB


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="storage_node", description="Run one ledger storage node (a bookie).")
    p.add_argument("--data-dir", required=True, type=pathlib.Path, help="journal, snapshot and cookie live here")
    p.add_argument("--port", required=True, type=int, help="gRPC port; 0 picks a free one")
    from_env = os.environ.get(METADATA_ENV)
    p.add_argument("--metadata", required=not from_env, default=from_env,
                   help=f"zk://host:port[,host:port...]/root (default: ${METADATA_ENV})")
    p.add_argument("--node-id", required=True, help="identity used in ledger ensembles")
    p.add_argument("--host", default="127.0.0.1", help="address to bind and to register")
    p.add_argument("--max-entry-bytes", type=int, default=8 * MiB, help="larger entries get BAD_REQUEST")
    p.add_argument("--read-only-threshold", type=float, default=0.95,
                   help="disk fill fraction at which the node turns read-only (rule 9)")
    p.add_argument("--disk-quota-bytes", type=int, default=0,
                   help="the node's share of a disk it shares with others: its data directory counts as full "
                        "at this many bytes (the --read-only-threshold fraction of it); 0: the filesystem only")
    p.add_argument("--read-only", action="store_true", help="start read-only (drain): refuse normal adds")
    p.add_argument("--checkpoint-interval", type=float, default=60.0, help="seconds between index snapshots")
    p.add_argument("--disk-check-interval", type=float, default=1.0, help="seconds between disk fill checks")
    p.add_argument("--zk-session-timeout", type=float, default=10.0, help="ZooKeeper session timeout in seconds")
    p.add_argument("--journal-segment-bytes", type=int, default=512 * MiB,
                   help="a new journal segment starts once the current one is this large")
    p.add_argument("--journal-page-cache-bytes", type=int, default=0,
                   help="the newest journal bytes left in the OS page cache for tailing reads; older, synced ones "
                        "are dropped from it, whole pages 4 MiB at a time, so that writes reuse warm pages (0: keep "
                        "none; -1: leave the page cache alone)")
    p.add_argument("--gc-interval", type=float, default=300.0,
                   help="seconds between garbage collection rounds (drop ledgers deleted from metadata, compact)")
    p.add_argument("--gc-grace", type=float, default=300.0,
                   help="seconds after the node first saw a ledger (or restarted) before garbage collection may "
                        "drop it, however deleted ZooKeeper says it is (rule 8)")
    p.add_argument("--gc-overreplicated-interval", type=float, default=86400.0,
                   help="seconds between garbage collection's checks for over-replicated ledgers (CLOSED ledgers "
                        "whose metadata names this node nowhere any more: their copies here are dropped); the "
                        "first check is in the first round; each reads the metadata of every ledger the node "
                        "holds; 0: never")
    p.add_argument("--compaction-threshold", type=float, default=0.5,
                   help="rewrite a sealed journal file when less than this fraction of it is still live")
    p.add_argument("--max-concurrent-rpcs", type=int, default=MAX_CONCURRENT_RPCS,
                   help="calls and streams (add and read streams, LAC long polls, health watches) the node serves "
                        "at once; one more is refused with RESOURCE_EXHAUSTED. Each costs memory (some 10 KiB "
                        "idle), so this bounds what clients, or anyone holding the token, can make the node hold")
    p.add_argument("--max-lac-waiters", type=int, default=MAX_LAC_WAITERS,
                   help="WaitLac long polls waiting at once (tailing readers), at most the calls served at once, so "
                        "that they leave room for writers; one more is answered ERROR at once (the client then reads "
                        "the LAC)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="Prometheus metrics HTTP port on --host; 0 picks a free one (registered in ZooKeeper)")
    p.add_argument("--tls-cert", type=pathlib.Path,
                   help="PEM certificate of this node (with --tls-key): serve gRPC over TLS only. It must name "
                        "the address clients dial (--host) as a subjectAltName")
    p.add_argument("--tls-key", type=pathlib.Path, help="PEM private key of --tls-cert")
    p.add_argument("--tls-ca", type=pathlib.Path,
                   help="PEM CA bundle: require every client to present a certificate signed by it (mutual TLS)")
    p.add_argument("--auth-token-file", type=pathlib.Path,
                   help="file holding a shared token: calls without it are refused with UNAUTHENTICATED")
    p.add_argument("--bind-keys-unchecked", action="store_true",
                   help="bind a ledger's master key on the first add, fence or WriteLac without checking it against "
                        "the password hash in the ledger's metadata (BookKeeper's bookies' way): any client holding "
                        "the token can then claim ledger ids not created yet. For benchmarks and tests that drive a "
                        "node with ledger ids that have no metadata; never for a cluster shared with untrusted "
                        "clients")
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO",
                   help="the least severe log lines written to stderr (ZooKeeper client lines: WARNING and up)")
    p.add_argument("--ready-file", type=pathlib.Path,
                   help="once registered, write {node_id, address, metrics_address, pid} here as JSON (atomically; "
                        "removed at shutdown): how a launcher learns the node serves and on which port")
    return p


def parse_config(argv: list[str] | None = None) -> NodeConfig:
    args = build_parser().parse_args(argv)
    config = NodeConfig(
        data_dir=args.data_dir.expanduser().resolve(),
        port=args.port,
        metadata=args.metadata,
        node_id=args.node_id,
        host=args.host,
        max_entry_bytes=args.max_entry_bytes,
        read_only_threshold=args.read_only_threshold,
        disk_quota_bytes=args.disk_quota_bytes,
        read_only=args.read_only,
        checkpoint_interval=args.checkpoint_interval,
        disk_check_interval=args.disk_check_interval,
        zk_session_timeout=args.zk_session_timeout,
        journal_segment_bytes=args.journal_segment_bytes,
        journal_page_cache_bytes=args.journal_page_cache_bytes,
        gc_interval=args.gc_interval,
        gc_grace=args.gc_grace,
        gc_overreplicated_interval=args.gc_overreplicated_interval,
        compaction_threshold=args.compaction_threshold,
        max_concurrent_rpcs=args.max_concurrent_rpcs,
        max_lac_waiters=args.max_lac_waiters,
        metrics_port=args.metrics_port,
        tls_cert=_resolved(args.tls_cert),
        tls_key=_resolved(args.tls_key),
        tls_ca=_resolved(args.tls_ca),
        auth_token_file=_resolved(args.auth_token_file),
        bind_keys_unchecked=args.bind_keys_unchecked,
        log_level=args.log_level,
        ready_file=_resolved(args.ready_file),
    )
    validate(config)
    return config


def _resolved(path: pathlib.Path | None) -> pathlib.Path | None:
    return path.expanduser().resolve() if path is not None else None


def validate(config: NodeConfig) -> None:
    MetadataUri.parse(config.metadata)
    checks = [
        (0 <= config.port <= 65535, f"--port {config.port} is not a TCP port (0..65535; 0 picks a free one)"),
        (layout.is_node_id(config.node_id), f"--node-id {config.node_id!r}: use {layout.NODE_ID_RULE}"),
        (1 <= config.max_entry_bytes <= 512 * MiB,
         f"--max-entry-bytes {config.max_entry_bytes} must be 1..{512 * MiB}"),
        (0.0 < config.read_only_threshold <= 1.0,
         f"--read-only-threshold {config.read_only_threshold} must be a disk fill fraction in (0, 1]"),
        (config.disk_quota_bytes >= 0,
         f"--disk-quota-bytes {config.disk_quota_bytes} must be 0 (none) or a byte count"),
        (0 < config.checkpoint_interval <= MAX_INTERVAL,
         f"--checkpoint-interval {config.checkpoint_interval} must be a finite number of seconds above 0, "
         f"{_AT_MOST}"),
        (0 < config.disk_check_interval <= MAX_INTERVAL,
         f"--disk-check-interval {config.disk_check_interval} must be a finite number of seconds above 0, "
         f"{_AT_MOST}"),
        (1.0 <= config.zk_session_timeout <= MAX_SESSION_TIMEOUT,
         f"--zk-session-timeout {config.zk_session_timeout} must be a finite number of seconds, at least 1 and at "
         f"most {MAX_SESSION_TIMEOUT:.0f} (an hour; ZooKeeper servers cap it lower, at 40 s by default)"),
        (config.journal_segment_bytes >= MiB, "--journal-segment-bytes must be at least 1 MiB"),
        (config.journal_page_cache_bytes >= -1,
         f"--journal-page-cache-bytes {config.journal_page_cache_bytes} must be -1 (keep all) or a byte count"),
        (0 < config.gc_interval <= MAX_INTERVAL,
         f"--gc-interval {config.gc_interval} must be a finite number of seconds above 0, {_AT_MOST}"),
        (0 <= config.gc_grace <= MAX_INTERVAL, f"--gc-grace {config.gc_grace} must be 0 or more seconds, {_AT_MOST}"),
        (0 <= config.gc_overreplicated_interval <= MAX_OVERREPLICATED_INTERVAL,
         f"--gc-overreplicated-interval {config.gc_overreplicated_interval} must be a finite number of seconds, "
         f"at most {MAX_OVERREPLICATED_INTERVAL:.0f} (30 days), or 0 (never)"),
        (0.0 <= config.compaction_threshold <= 1.0,
         f"--compaction-threshold {config.compaction_threshold} must be a fraction in [0, 1]"),
        (config.max_concurrent_rpcs >= 1,
         f"--max-concurrent-rpcs {config.max_concurrent_rpcs} must be at least 1 (default {MAX_CONCURRENT_RPCS})"),
        (1 <= config.max_lac_waiters <= config.max_concurrent_rpcs,
         f"--max-lac-waiters {config.max_lac_waiters} must be 1..{config.max_concurrent_rpcs} (at most "
         f"--max-concurrent-rpcs, so that long polls leave room for other calls; default {MAX_LAC_WAITERS})"),
        (0 <= config.metrics_port <= 65535, f"--metrics-port {config.metrics_port} is not a TCP port (0..65535)"),
        ((config.tls_cert is None) == (config.tls_key is None), "--tls-cert and --tls-key go together"),
        (config.tls_ca is None or config.tls_cert is not None,
         "--tls-ca (verify client certificates) needs --tls-cert and --tls-key (the node's own certificate)"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    for flag, path in (("--tls-cert", config.tls_cert), ("--tls-key", config.tls_key), ("--tls-ca", config.tls_ca),
                       ("--auth-token-file", config.auth_token_file)):
        if path is not None and not path.is_file():
            raise ConfigError(f"{flag} {path} is not a readable file")
    for flag, path, kind in (("--tls-cert", config.tls_cert, CERTIFICATE), ("--tls-key", config.tls_key, PRIVATE_KEY),
                             ("--tls-ca", config.tls_ca, CERTIFICATE)):
        if path is not None:
            _check_pem(flag, path, kind)
    if config.ready_file is not None and not config.ready_file.parent.is_dir():
        raise ConfigError(f"--ready-file {config.ready_file}: directory {config.ready_file.parent} does not exist")


def _check_pem(flag: str, path: pathlib.Path, kind: str) -> None:
    try:
        lacking = missing_pem(path.read_bytes(), kind)
    except OSError as exc:
        raise ConfigError(f"{flag} {path} is not a readable file ({exc.strerror})") from None
    if lacking:
        raise ConfigError(f"{flag} {path} holds {lacking}; give a PEM file")

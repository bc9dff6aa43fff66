"""`ledger cluster start|status|stop`: a local cluster (embedded ZooKeeper + N storage nodes)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys

from connector.client.security import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV
from connector.cluster import LocalCluster
from connector.commands import node_security
from connector.commands.arguments import non_empty, positive
from metadata.model import HEALTH_OK
from metadata.store import METADATA_ENV

DEFAULT_DIR = "ledger-cluster"
MAX_NODES = 100   # each node is a process on this machine, with its own port and directory


def register(subparsers) -> None:
    parser = subparsers.add_parser("cluster", help="run a local cluster: embedded ZooKeeper + storage nodes")
    actions = parser.add_subparsers(dest="action", required=True)

    start = actions.add_parser("start", help="start in the background; returns once every node is registered")
    start.add_argument("--nodes", type=_nodes, default=3,
                       help=f"number of storage nodes (default 3, at most {MAX_NODES})")
    start.add_argument("--dir", type=non_empty, default=DEFAULT_DIR,
                       help=f"cluster directory (default ./{DEFAULT_DIR})")
    start.add_argument("--tls", action="store_true",
                       help="create a local CA and certificates under DIR/tls and run the nodes with mutual TLS "
                            "(remembered in DIR/cluster.json: later starts keep TLS on)")
    start.set_defaults(func=run_start)

    status = actions.add_parser("status", help="show ZooKeeper and every node's health, role and disk use")
    status.add_argument("--dir", type=non_empty, default=DEFAULT_DIR)
    status.add_argument("--json", action="store_true",
                        help="one JSON object: metadata, zookeeper, tls and every node's health fields")
    node_security.add_arguments(status)
    status.set_defaults(func=run_status)

    stop = actions.add_parser("stop", help="clean shutdown; starting again on the same --dir keeps all data")
    stop.add_argument("--dir", type=non_empty, default=DEFAULT_DIR)
    stop.set_defaults(func=run_stop)


def _nodes(text: str) -> int:
    value = positive(text)
    if value > MAX_NODES:
        raise argparse.ArgumentTypeError(f"{text} is over {MAX_NODES}, the most storage nodes a local cluster runs "
                                         "(each is a process on this machine)")
    return value


def run_start(args) -> int:
    cluster = LocalCluster(args.dir, nodes=args.nodes, tls=args.tls)
    try:
        uri = cluster.start()
    finally:
        for note in cluster.notes:
            print(f"ledger cluster start: {note}", file=sys.stderr)
    print(uri, flush=True)  # stdout: the URI alone, for scripts (uri=$(ledger cluster start ...))
    for line in export_lines(uri, cluster.client_tls):
        print(line, file=sys.stderr)
    return 0


def export_lines(uri: str, tls) -> list[str]:
    """What a shell needs to point every ledger command, node and client at the cluster: paste the lines."""
    settings = [f"{METADATA_ENV}={shlex.quote(uri)}"]
    if tls is not None:
        settings += [f"{TLS_CA_ENV}={shlex.quote(tls.ca)}", f"{TLS_CERT_ENV}={shlex.quote(tls.cert)}",
                     f"{TLS_KEY_ENV}={shlex.quote(tls.key)}"]
    return ["# every ledger command, node and client then uses this cluster:",
            *(f"export {setting}" for setting in settings)]


def run_status(args) -> int:
    status = LocalCluster(args.dir).status(**node_security.client_options(args))
    healthy = status["zookeeper"] and all(_serving(node) for node in status["nodes"])
    if args.json:
        print(json.dumps(dict(status, healthy=healthy)))
        return 0 if healthy else 1
    print(f"metadata   {status['metadata']}")
    print(f"zookeeper  {'serving' if status['zookeeper'] else 'DOWN'}")
    print(f"tls        {'on (mutual)' if status['tls'] else 'off'}")
    for node in status["nodes"]:
        if _serving(node):
            used = node["disk_used_bytes"] / max(node["disk_total_bytes"], 1)
            health = f"up  {node['state']:<9} disk {used:5.1%}  ledgers {node['ledgers']}  entries {node['entries']}"
            if node["metrics_address"]:
                health += f"  metrics http://{node['metrics_address']}/metrics"
            if node["read_only_reason"]:
                health += f"  ({node['read_only_reason']})"
        else:
            why = node.get("error") or ("not registered" if not node["registered"] else node["health"])
            health = "DOWN" if not node["running"] else f"unhealthy ({why})"
        print(f"{node['node_id']:<10} {node['address']:<21} {health}")
    return 0 if healthy else 1


def _serving(node: dict) -> bool:
    """Running, registered, answering, and not broken (a node whose journal broke serves nothing until restarted;
    a node too old to report its health counts by the rest)."""
    return node["running"] and node["registered"] and "error" not in node and node["health"] in (HEALTH_OK, "")


def run_stop(args) -> int:
    LocalCluster(args.dir).stop()
    print(f"stopped the cluster in {args.dir}")
    return 0

"""`ledger init [--metadata URI]`: initialise a metadata root (BookKeeper's `shell initnewcluster`).

Nothing else creates a root: a client, node or command pointed at a root that was never initialised fails
naming it, so a mistyped URI cannot start an empty second cluster. `ledger cluster start` and the demo
initialise their own root.
"""
from __future__ import annotations

from connector.commands.arguments import add_metadata
from connector.commands.command_client import CONNECT_TIMEOUT
from metadata import layout
from metadata.store import MetadataStore, MetadataUri, initialise_root

FEATURE_HELP = {
    "copy-drops": "storage nodes drop their copies of CLOSED ledgers whose metadata names them nowhere any more "
                  "(over-replicated ledgers); enable it once every `ledger audit` and `ledger decommission` that "
                  "may run, runs this version (an older one's re-replication does not check a ledger's copy_drops "
                  "and could name a node that has just dropped the copies)",
}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "init", help="initialise a metadata root (once per cluster, before its nodes start); idempotent",
        description="Create the metadata root with its layout and a marker saying it is initialised. Clients, "
                    "nodes and commands refuse a root without it. On a root that is initialised already it "
                    "changes nothing and exits 0. With ZooKeeper credentials (zk://user:secret@... or "
                    "$LEDGER_ZK_AUTH) the whole tree is readable and writable by those credentials only.",
    )
    add_metadata(parser)
    parser.add_argument("--enable", choices=sorted(layout.KNOWN_FEATURES), action="append", default=[],
                        metavar="FEATURE",
                        help="turn a feature on in an initialised cluster (a new cluster has every one): "
                             + "; ".join(f"{name}: {text}" for name, text in sorted(FEATURE_HELP.items())))
    parser.set_defaults(func=run)


def run(args) -> int:
    uri = MetadataUri.parse(args.metadata)
    done = initialise_root(args.metadata, connect_timeout=CONNECT_TIMEOUT)
    where = f"metadata root {uri.root} at ZooKeeper {uri.hosts}"
    about = f"(layout version {done.marker.version}, instance {done.marker.instance_id})"
    if done.outcome == "already":
        print(f"{where} is initialised already {about}; nothing to do")
    elif done.outcome == "adopted":
        print(f"{where} was made by an older version without a layout marker; marked it initialised {about}")
    else:
        print(f"initialised {where} {about}")
    if args.enable:
        with MetadataStore(args.metadata, connect_timeout=CONNECT_TIMEOUT) as store:
            for feature in args.enable:
                done = store.enable_feature(layout.KNOWN_FEATURES[feature])
                print(f"feature {feature} {'enabled' if done else 'was enabled already'}")
    return 0

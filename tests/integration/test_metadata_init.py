"""Metadata roots are initialised explicitly (issue 16 item 6): `ledger init` creates a root with its layout and
marker and is idempotent; a client, a command and a storage node pointed at a root nobody initialised fail with
one line that names the root and says how to initialise it, and create nothing; a root an older version made
(layout directories, no marker) still works. `ledger cluster start` initialises its own root and prints the
export line that points later commands at it."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from connector.client import LedgerClient
from connector.commands.cluster import export_lines
from connector.client.security import TlsConfig
from metadata import layout
from metadata.errors import MetadataError, UninitialisedRootError
from metadata.store import MetadataStore, MetadataUri, initialise_root
from tests.harness.node_process import NodeProcess

CLI = [sys.executable, "-m", "connector.cli"]
SECRET = "init-s3cret"


@pytest.fixture
def zk(zookeeper):
    """A plain kazoo session on the test ZooKeeper (no chroot), to look at what the commands left behind."""
    client = KazooClient(hosts=zookeeper.address)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


def ledger(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`ledger ARGS` in a process of its own; $LEDGER_METADATA only if env gives it."""
    environment = {k: v for k, v in os.environ.items() if k != "LEDGER_METADATA"}
    environment.update(env or {})
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=environment)


def root_of(uri: str) -> str:
    return MetadataUri.parse(uri).root


def assert_refused_in_one_line(result: subprocess.CompletedProcess, uri: str, prefix: str) -> str:
    """Exit status non-zero, stderr one line: prefix, the root, the ZooKeeper and `ledger init --metadata URI`."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(prefix), line
    assert f"metadata root {root_of(uri)} " in line and MetadataUri.parse(uri).hosts in line, line
    assert f"run `ledger init --metadata {uri}` to initialise it" in line, line
    return line


def test_ledger_init_creates_the_root_with_its_layout_and_is_idempotent(fresh_root, zk):
    root = root_of(fresh_root)
    first = ledger("init", "--metadata", fresh_root)
    assert first.returncode == 0 and first.stderr == "", first.stderr
    assert first.stdout.startswith(f"initialised metadata root {root} at ZooKeeper "), first.stdout
    assert sorted(zk.get_children(root)) == sorted(d.lstrip("/") for d in (*layout.ALL_DIRS, layout.MARKER,
                                                                            layout.FEATURES))
    assert zk.exists(root + layout.COPY_DROPS)     # a new cluster has every feature
    data, stat = zk.get(root + layout.MARKER)
    marker = layout.LayoutMarker.decode(data)
    assert marker.version == layout.LAYOUT_VERSION and marker.instance_id in first.stdout

    again = ledger("init", env={"LEDGER_METADATA": fresh_root})  # the default of --metadata
    assert again.returncode == 0 and again.stderr == "", again.stderr
    hosts = MetadataUri.parse(fresh_root).hosts
    assert again.stdout == (f"metadata root {root} at ZooKeeper {hosts} is initialised already "
                            f"(layout version {marker.version}, instance {marker.instance_id}); nothing to do\n")
    assert zk.get(root + layout.MARKER)[1].mzxid == stat.mzxid  # not rewritten
    with MetadataStore(fresh_root) as store:
        assert store.layout == marker


def test_a_client_on_an_uninitialised_root_fails_naming_it_and_creates_nothing(fresh_root, zk):
    parent = root_of(fresh_root).rsplit("/", 1)[0]
    with pytest.raises(UninitialisedRootError) as refused:
        LedgerClient(fresh_root)
    message = str(refused.value)
    assert "\n" not in message and f"metadata root {root_of(fresh_root)} does not exist at ZooKeeper" in message
    assert f"run `ledger init --metadata {fresh_root}` to initialise it" in message
    assert zk.exists(parent) is None  # not the root, not even its parent
    with pytest.raises(UninitialisedRootError):
        MetadataStore(fresh_root)
    assert zk.exists(parent) is None


def test_ledger_list_on_an_uninitialised_root_is_one_line_without_a_traceback(fresh_root, zk):
    listed = ledger("list", "--metadata", fresh_root)
    line = assert_refused_in_one_line(listed, fresh_root, "ledger: error: metadata root")
    assert "does not exist" in line and listed.stdout == ""
    from_env = ledger("stream", "list", env={"LEDGER_METADATA": fresh_root})
    assert_refused_in_one_line(from_env, fresh_root, "ledger: error: metadata root")
    assert zk.exists(root_of(fresh_root)) is None


def test_a_storage_node_on_an_uninitialised_root_refuses_to_start_and_creates_nothing(fresh_root, zk, tmp_path):
    node = ledger("node", "--data-dir", str(tmp_path / "node"), "--port", "0", "--node-id", "node-1",
                  env={"LEDGER_METADATA": fresh_root}, timeout=60)
    assert_refused_in_one_line(node, fresh_root, "storage node node-1 refuses to start: metadata root")
    assert zk.exists(root_of(fresh_root)) is None


def test_a_root_that_exists_but_was_never_initialised_is_refused_until_init(fresh_root, zk):
    root = root_of(fresh_root)
    zk.ensure_path(root)  # made by hand (zkCli create), or by an init that stopped half-way
    listed = ledger("list", "--metadata", fresh_root)
    assert "exists but was never initialised" in assert_refused_in_one_line(listed, fresh_root, "ledger: error:")
    assert zk.get_children(root) == []
    assert ledger("init", "--metadata", fresh_root).returncode == 0
    assert ledger("list", "--metadata", fresh_root).returncode == 0


def test_init_refuses_a_root_that_holds_another_applications_tree(fresh_root, zk):
    root = root_of(fresh_root)
    zk.ensure_path(f"{root}/brokers/ids")
    refused = ledger("init", "--metadata", fresh_root)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr == (f"ledger: error: metadata root {root} at ZooKeeper {MetadataUri.parse(fresh_root).hosts} "
                              "holds znodes that are not a ledger store's (brokers): it belongs to something else; "
                              "choose another root\n")
    assert zk.get_children(root) == ["brokers"]


def test_a_root_made_by_an_older_version_without_a_marker_still_works(fresh_root, zk, tmp_path):
    root = root_of(fresh_root)
    for directory in layout.ALL_DIRS:  # what every store of an older version created on connecting
        zk.ensure_path(root + directory)
    zk.delete(root + layout.COMPACTIONS)  # and a version older still, from before compactions
    nodes = [NodeProcess(fresh_root, tmp_path / f"node-{i}", f"node-{i}") for i in (1, 2, 3)]
    try:
        for node in nodes:
            node.start()  # the nodes accept the root (and the first one writes the marker)
        with LedgerClient(fresh_root) as lc:
            with lc.create_ledger(3, 2, 2) as w:
                w.append(b"on an old root")
            assert [e.payload for e in lc.open_ledger(w.ledger_id).read(0, 0)] == [b"on an old root"]
    finally:
        for node in nodes:
            node.kill()
    marker = layout.LayoutMarker.decode(zk.get(root + layout.MARKER)[0])
    assert marker.version == layout.LAYOUT_VERSION
    assert zk.exists(root + layout.COMPACTIONS) is not None
    again = ledger("init", "--metadata", fresh_root)
    assert again.returncode == 0 and "initialised already" in again.stdout and marker.instance_id in again.stdout


def test_a_foreign_tree_with_a_ledgers_child_is_refused_not_adopted(fresh_root, zk):
    """A mistyped root over another application's tree that happens to hold `ledgers` (BookKeeper's, Pulsar's):
    a client or command opening it is refused, and nothing is written into that tree. Before the fix any root
    with a `ledgers` child counted as ours and got our ten layout directories and a marker."""
    root = root_of(fresh_root)
    zk.ensure_path(f"{root}/ledgers/00/0000")
    zk.ensure_path(f"{root}/managed-ledgers")
    refused = ledger("list", "--metadata", fresh_root)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "holds znodes that are not a ledger store's (managed-ledgers)" in refused.stderr
    assert sorted(zk.get_children(root)) == ["ledgers", "managed-ledgers"]


def test_init_marks_a_root_made_by_an_older_version(fresh_root, zk):
    root = root_of(fresh_root)
    zk.ensure_path(root + layout.LEDGERS)
    zk.create(root + layout.LEDGERS + "/L0000000007", b"kept")
    adopted = ledger("init", "--metadata", fresh_root)
    assert adopted.returncode == 0, adopted.stderr
    assert "was made by an older version without a layout marker; marked it initialised" in adopted.stdout
    assert zk.get(root + layout.LEDGERS + "/L0000000007")[0] == b"kept"
    assert sorted(zk.get_children(root)) == sorted(d.lstrip("/") for d in (*layout.ALL_DIRS, layout.MARKER))
    assert not zk.exists(root + layout.FEATURES)   # an existing cluster's clients may be older: none is enabled


def test_ledger_init_with_credentials_protects_the_whole_tree(fresh_root, zk):
    protected = fresh_root.replace("zk://", f"zk://ledger:{SECRET}@", 1)
    done = ledger("init", "--metadata", protected)
    assert done.returncode == 0 and SECRET not in done.stdout + done.stderr, done.stderr
    root = root_of(fresh_root)
    for path in (root, root + layout.MARKER, root + layout.LEDGERS):
        with pytest.raises(NoAuthError):
            zk.get(path)
    with pytest.raises(MetadataError, match="ACLs"):
        MetadataStore(fresh_root)  # no credentials: refused, not told the root is missing
    with MetadataStore(protected) as store:
        assert store.layout.version == layout.LAYOUT_VERSION


def test_init_without_credentials_then_with_them_is_refused(fresh_root):
    initialise_root(fresh_root)
    with pytest.raises(MetadataError, match="created without credentials"):
        initialise_root(fresh_root.replace("zk://", f"zk://ledger:{SECRET}@", 1))


def test_export_lines_quote_what_a_shell_needs():
    tls = TlsConfig(ca="/tmp/a dir/ca.pem", cert="/c.pem", key="/k.pem")
    assert export_lines("zk://127.0.0.1:2181/ledgers", tls)[1:] == [
        "export LEDGER_METADATA=zk://127.0.0.1:2181/ledgers",
        "export LEDGER_TLS_CA='/tmp/a dir/ca.pem'", "export LEDGER_TLS_CERT=/c.pem", "export LEDGER_TLS_KEY=/k.pem",
    ]
    assert export_lines("zk://127.0.0.1:2181/ledgers", None)[0].startswith("#")


def test_cluster_start_initialises_its_root_and_prints_the_export_line(tmp_path, zk):
    directory = tmp_path / "cluster"
    started = ledger("cluster", "start", "--nodes", "1", "--dir", str(directory), timeout=180)
    try:
        assert started.returncode == 0, started.stderr
        uri = started.stdout.strip()  # stdout: the URI alone, for scripts
        assert uri.startswith("zk://127.0.0.1:") and uri.endswith("/ledgers"), started.stdout
        exports = [line for line in started.stderr.splitlines() if line.startswith("export ")]
        assert exports == [f"export LEDGER_METADATA={uri}"], started.stderr
        with MetadataStore(uri) as store:
            assert store.exists(layout.MARKER)
        # The line pasted into a shell points the next command at the cluster (issue 16: `ledger list` went to
        # 127.0.0.1:2181 and waited 15 s).
        env = {k: v for k, v in os.environ.items() if k != "LEDGER_METADATA"}
        listed = subprocess.run(["bash", "-c", f"{exports[0]}; {shlex.join(CLI)} list"], capture_output=True,
                                text=True, timeout=60, env=env)
        assert listed.returncode == 0 and listed.stderr == "", listed.stderr
        assert listed.stdout.split()[0] == "ledger"  # the header of an empty listing
    finally:
        ledger("cluster", "stop", "--dir", str(directory), timeout=120)

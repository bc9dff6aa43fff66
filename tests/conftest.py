"""Shared fixtures: one real ZooKeeper per test session, a fresh chroot per test, real node processes."""
from __future__ import annotations

import itertools
import os
import pathlib
import sys

import pytest
from hypothesis import settings

from metadata.embedded import EmbeddedZooKeeper
from metadata.store import MetadataStore, initialise_root
from tests.harness.class_archive import BASE_OPTIONS, java_options
from tests.harness.node_process import NodeProcess

# Spark binds to the first non-loopback address unless told otherwise; tests stay on 127.0.0.1.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def use_test_jvm_options() -> None:
    """Every JVM a test starts (ZooKeeper, Spark drivers, executors, applications, the notebook's) gets the
    tests' options (tests/harness/class_archive.py): the client compiler, the serial collector and, once
    scripts/test.sh's background build has written it, the class archive. CPU is what the suite is bound by
    on CI's two cores. Options of your own in JDK_JAVA_OPTIONS are kept. The java launcher notes the variable
    on each JVM's stderr."""
    if os.environ.get("JDK_JAVA_OPTIONS", BASE_OPTIONS).startswith(BASE_OPTIONS):
        os.environ["JDK_JAVA_OPTIONS"] = java_options()


use_test_jvm_options()

_chroots = itertools.count()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "root_credentials(user_secret): metadata_uri's root is initialised with these ZooKeeper "
                   "digest credentials (user:secret), so only they can read or change it")
    config.addinivalue_line(
        "markers", "keys_unchecked: the nodes start_node starts bind master keys unchecked (--bind-keys-unchecked), "
                   "for tests of a node's own rules that drive it with ledger ids that have no metadata")


# Property tests check results, not speed: hypothesis's default 200 ms deadline per example is a timed assertion,
# which fails on a loaded CI machine (a first example that imports or warms a library).
settings.register_profile("ledger", deadline=None)
settings.load_profile("ledger")


@pytest.fixture(autouse=True)
def jvm_options_now():
    """The archive may appear while the suite runs: JVMs started from here on use it."""
    use_test_jvm_options()


@pytest.fixture(autouse=True)
def no_shared_clients():
    """A test that plans or reads in this process (as Spark's workers would) leaves the shared clients
    (connector/spark/task_client.py: read tasks', driver-side steps') open for the next step; they are closed after
    the test, so that no test inherits one connected to another test's cluster (or to a ZooKeeper that test
    stopped)."""
    yield
    task_client = sys.modules.get("connector.spark.task_client")
    if task_client is not None:
        task_client.close_shared()


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory) -> EmbeddedZooKeeper:
    server = EmbeddedZooKeeper(tmp_path_factory.mktemp("zookeeper")).start()
    yield server
    server.stop()


@pytest.fixture
def fresh_root(zookeeper) -> str:
    """The metadata URI of a root of this test's own that nobody initialised (`ledger init` not run)."""
    return zookeeper.uri(f"/t{os.getpid()}-{next(_chroots)}/ledgers")


@pytest.fixture
def metadata_uri(fresh_root, request) -> str:
    """A fresh metadata root for this test, initialised (as `ledger init` does), so tests never see each other's
    ledgers. With @pytest.mark.root_credentials("user:secret") the root is created protected by them."""
    credentials = request.node.get_closest_marker("root_credentials")
    if credentials is None:
        initialise_root(fresh_root)
    else:
        initialise_root(fresh_root.replace("zk://", f"zk://{credentials.args[0]}@", 1))
    return fresh_root


@pytest.fixture
def store(metadata_uri) -> MetadataStore:
    with MetadataStore(metadata_uri) as s:
        yield s


@pytest.fixture
def start_node(metadata_uri, tmp_path, request):
    """start_node(node_id=None, *extra_args, data_dir=None) -> a serving NodeProcess; all killed at teardown. With
    @pytest.mark.keys_unchecked every node gets --bind-keys-unchecked."""
    started: list[NodeProcess] = []
    counter = itertools.count(1)
    unchecked = ("--bind-keys-unchecked",) if request.node.get_closest_marker("keys_unchecked") else ()

    def start(node_id: str | None = None, *extra_args: str, data_dir: pathlib.Path | None = None,
              expect_failure: bool = False) -> NodeProcess:
        node_id = node_id or f"node-{next(counter)}"
        node = NodeProcess(metadata_uri, data_dir or tmp_path / node_id, node_id, *extra_args, *unchecked)
        started.append(node)
        return node.start(expect_failure=expect_failure)

    yield start
    for node in started:
        node.kill()


@pytest.fixture
def cluster(start_node):
    """cluster(n, *extra_args) -> n serving storage nodes."""
    def make(n: int = 3, *extra_args: str) -> list[NodeProcess]:
        return [start_node(None, *extra_args) for _ in range(n)]

    return make

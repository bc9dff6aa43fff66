"""Beyond one machine, on one machine: storage nodes started exactly as deploy/systemd/ledger-node@.service
starts them (its ExecStart line, with the variables of deploy/node.env.example), and a Spark application
submitted with spark-submit under local-cluster[2,1,1024], whose executors are separate JVMs with their own
Python workers, writing and reading through those nodes."""
from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

from connector.client import LedgerClient
from connector.cluster import node_info
from metadata.embedded import free_port
from metadata.store import initialise_root
from tests.harness.node_process import NodeProcess

REPO = pathlib.Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "ledger-node@.service"
ENV_EXAMPLE = REPO / "deploy" / "node.env.example"
INSTALLED_BIN = "/opt/ledger-store/venv/bin/"  # where the unit expects the installed package's virtualenv
VENV_BIN = pathlib.Path(sys.executable).parent
ROWS = 8_000
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SPLIT_VARIABLE = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")


def unit_setting(name: str) -> str:
    """The value of a [Service] setting of the unit file (backslash continuations joined)."""
    text = UNIT.read_text().replace("\\\n", " ")
    values = [line.split("=", 1)[1].strip() for line in text.splitlines() if line.startswith(f"{name}=")]
    assert len(values) == 1, f"{UNIT} must have exactly one {name}= line"
    return values[0]


def read_env_file(path: pathlib.Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name.strip()] = value.strip().strip('"')
    return env


def expand_exec_start(line: str, instance: str, env: dict[str, str]) -> list[str]:
    """systemd's expansion: %i is the instance, ${NAME} one word, a lone $NAME split at whitespace."""
    argv = []
    for word in shlex.split(line.replace("%i", instance)):
        split = _SPLIT_VARIABLE.match(word)
        if split:
            argv.extend(env[split[1]].split())
        else:
            argv.append(_VARIABLE.sub(lambda m: env[m[1]], word))
    return argv


class UnitNode(NodeProcess):
    """A storage node run with the unit's ExecStart, the installed path mapped to this virtualenv."""

    def __init__(self, metadata_uri: str, data_dir: pathlib.Path, node_id: str):
        super().__init__(metadata_uri, data_dir, node_id)
        env = read_env_file(ENV_EXAMPLE)
        env.update(LEDGER_METADATA=metadata_uri, LEDGER_DATA_DIR=str(data_dir), LEDGER_HOST="127.0.0.1",
                   LEDGER_PORT=str(free_port()), LEDGER_METRICS_PORT=str(free_port()))
        self.env = env
        self.argv = expand_exec_start(unit_setting("ExecStart"), node_id, env)

    def command(self) -> list[str]:
        assert self.argv[0].startswith(INSTALLED_BIN), f"ExecStart runs {self.argv[0]}, not from {INSTALLED_BIN}"
        return [str(VENV_BIN / self.argv[0][len(INSTALLED_BIN):]), *self.argv[1:]]


# Flags the unit leaves to LEDGER_NODE_EXTRA_ARGS: switches and optional security files; and the file a
# launcher (not systemd) waits for.
OPTIONAL_FLAGS = {"--read-only", "--bind-keys-unchecked", "--tls-cert", "--tls-key", "--tls-ca", "--auth-token-file",
                  "--ready-file"}


def test_unit_sets_every_storage_node_flag_from_the_env_example():
    exec_start = unit_setting("ExecStart")
    env = read_env_file(ENV_EXAMPLE)
    used = set(_VARIABLE.findall(exec_start)) | {m[1] for m in map(_SPLIT_VARIABLE.match, shlex.split(exec_start)) if m}
    assert used == set(env), f"unused in the unit: {sorted(set(env) - used)}; missing from the example: {sorted(used - set(env))}"
    help_text = subprocess.run([sys.executable, "-m", "storage_node", "--help"], capture_output=True, text=True).stdout
    flags = set(re.findall(r"(--[a-z][a-z-]+)", help_text)) - {"--help"}
    given = {word for word in expand_exec_start(exec_start, "node-1", env) if word.startswith("--")}
    assert flags - given <= OPTIONAL_FLAGS, f"the unit does not set {sorted(flags - given - OPTIONAL_FLAGS)}"


def test_spark_on_local_cluster_against_nodes_started_by_the_unit(zookeeper, tmp_path):
    # A multi-host URI, as for a ZooKeeper ensemble: both names reach the one test server.
    uri = f"zk://{zookeeper.address},localhost:{zookeeper.port}/multi-host-{os.getpid()}/ledgers"
    initialise_root(uri)  # what an operator runs once (`ledger init`) before the nodes' units start
    nodes = [UnitNode(uri, tmp_path / f"node-{i}", f"node-{i}") for i in (1, 2, 3)]
    try:
        for node in nodes:
            node.start()
            assert node.address == f"127.0.0.1:{node.env['LEDGER_PORT']}", node.log()
        job = subprocess.run(
            [str(VENV_BIN / "spark-submit"), "--master", "local-cluster[2,1,1024]",
             "--conf", "spark.executor.memory=512m", "--conf", "spark.ui.enabled=false",
             "--conf", "spark.sql.python.filterPushdown.enabled=true",
             "--conf", f"spark.pyspark.python={sys.executable}", "--conf", f"spark.pyspark.driver.python={sys.executable}",
             str(REPO / "tests" / "integration" / "multi_host_job.py"), uri, "events", str(ROWS), "s3cret"],
            cwd=REPO, env=spark_submit_env(), capture_output=True, text=True, timeout=240,
        )
        results = [line for line in job.stdout.splitlines() if line.startswith("RESULT ")]
        assert job.returncode == 0 and results, job.stderr[-4000:]
        result = json.loads(results[0][len("RESULT "):])
        assert result["master"] == "local-cluster[2,1,1024]" and result["executors"] == 2
        assert result["rows"] == result["ids"] == ROWS and result["id_sum"] == sum(range(ROWS))
        assert result["ledgers"] == 4
        with LedgerClient(uri) as lc:
            ensembles = {node for i in lc.list_ledgers() for f in lc.ledger_metadata(i).fragments for node in f.ensemble}
        assert ensembles == {"node-1", "node-2", "node-3"}
        assert all(node_info(node.address)["entries"] > 0 for node in nodes)
    finally:
        for node in nodes:
            node.stop()


def spark_submit_env() -> dict[str, str]:
    """This environment minus the gateway of a SparkSession this test process may hold."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY_")}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    return env

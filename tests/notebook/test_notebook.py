"""notebooks/explore.ipynb runs top to bottom in a real Jupyter kernel, and is committed with clean outputs."""
from __future__ import annotations

import json
import os
import pathlib
import re
import sys
import tempfile

import nbformat
import pytest
from nbclient import NotebookClient

from connector.cluster import LocalCluster

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "explore.ipynb"

# What must never be committed in an output: this machine's paths, host addresses and tracebacks.
MACHINE_PATH = re.compile(
    r"(?<![\w.~-])/(?:tmp|var|home|root|Users|work|private|opt|usr|mnt|srv|data|scratch|run|etc|nix|media|proc|"
    r"Volumes)(?:/|\b)|\b[A-Z]:\\(?:[\w .-]+\\)+"
)
HOST_ADDRESS = re.compile(
    r"\b(?:\d{1,3}\.){3}\d{1,3}\b|\blocalhost:\d+|\[[0-9a-fA-F]*:[0-9a-fA-F:]+\](?::\d+)?"
)
TRACEBACK = re.compile(
    r"Traceback \(most recent call last\)|^\s*File \"[^\"]+\", line \d+|Py4JJavaError|^\s+at [\w.$]+\([\w.]+:\d+\)",
    re.MULTILINE,
)


def outputs(notebook, output_type: str) -> list:
    return [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == output_type]


def stdout(notebook) -> str:
    return "".join(o.text for o in outputs(notebook, "stream") if o.name == "stdout")


def images(notebook) -> list:
    return [o for kind in ("display_data", "execute_result") for o in outputs(notebook, kind) if "image/png" in o.data]


def output_texts(notebook):
    """(where, text) of every text an output holds: streams, errors, and every non-image representation."""
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        for output in cell.outputs:
            where = f"cell {index} {output.output_type}"
            if output.output_type == "stream":
                yield f"{where} {output.name}", output.text
            elif output.output_type == "error":
                yield where, "\n".join([output.ename, output.evalue, *output.traceback])
            else:
                for mime, data in output.get("data", {}).items():
                    if not mime.startswith("image/"):
                        yield f"{where} {mime}", data if isinstance(data, str) else json.dumps(data)


def leaks(notebook) -> list[str]:
    """Each machine path, host address or traceback in the notebook's outputs, with the cell that shows it."""
    literal = {str(NOTEBOOK.parents[1]), sys.prefix, tempfile.gettempdir(), os.path.expanduser("~")} - {"/", ""}
    found = []
    for where, text in output_texts(notebook):
        for kind, pattern in (("machine path", MACHINE_PATH), ("host address", HOST_ADDRESS), ("traceback", TRACEBACK)):
            found += [f"{where}: {kind} {m.group(0)!r}" for m in pattern.finditer(text)]
        found += [f"{where}: machine path {path!r}" for path in literal if path in text]
    return found + [f"{where}: an error output" for where, _ in output_texts(notebook) if " error" in where]


def test_committed_notebook_has_its_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count and cell.outputs for cell in code), "run the notebook and commit it with outputs"
    assert not outputs(notebook, "error")
    assert len(images(notebook)) >= 3
    text = stdout(notebook)
    assert "every acknowledged entry came back" in text
    assert "the tailing query read every row the stream holds, exactly once" in text


def test_committed_notebook_outputs_hold_no_machine_path_host_address_or_traceback():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert not leaks(notebook), "\n".join(leaks(notebook)[:20])


def test_notebook_uses_only_the_public_api():
    """A user has format("ledger") (found without registering), LedgerClient, LocalCluster and the CLI."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    source = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    imported = set(re.findall(r"^\s*(?:from|import) ((?:connector|metadata|storage_node|protos)[\w.]*)", source, re.M))
    assert imported <= {"connector.client", "connector.cluster"}, imported
    assert "dataSource.register" not in source and ".store" not in source


@pytest.mark.timeout(900)   # a whole notebook with Spark: over pytest.ini's 300 s when it shares 2 cores with workers
def test_notebook_executes_cleanly(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel starts its own cluster (no LEDGER_METADATA), under tmp_path, and its own Spark (not the
    # gateway of a SparkSession this test process may hold).
    env = {k: v for k, v in os.environ.items() if k != "LEDGER_METADATA" and not k.startswith("PYSPARK_GATEWAY_")}
    env["TMPDIR"] = str(tmp_path)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute(env=env)
    finally:
        nbformat.write(notebook, tmp_path / NOTEBOOK.name)
        for leftover in tmp_path.glob("ledger-explore-*/cluster/cluster.json"):  # it failed before its last cell
            LocalCluster(leftover.parent).stop()
    text = stdout(notebook)
    assert not outputs(notebook, "error")
    assert f"kernel: Python {sys.version.split()[0]}, pyspark " in text and "ledger-store " in text
    assert "started a local cluster: zk://…/ledgers" in text
    assert re.search(r"\$ ledger delete (\d+)\nledger: error: ledger \1 holds offsets of stream", text)
    assert "the time range and the _timestamp filter found exactly the second write" in text
    assert "the tailing query read every row the stream holds, exactly once" in text
    assert "rows behind" in text
    assert "entries of the crashed writer read back: 5,000 of 5,000, misplaced 0" in text
    assert "the zombie's next append: LedgerFencedError" in text
    assert len(images(notebook)) == 3
    assert "stopped the local cluster" in text
    assert not leaks(notebook), "\n".join(leaks(notebook)[:20])
    assert not list(tmp_path.glob("ledger-explore-*")), "the notebook removes the cluster it started"

"""notebooks/explore.ipynb runs top to bottom in a real Jupyter kernel, and is committed with its outputs."""
from __future__ import annotations

import os
import pathlib
import sys

import nbformat
from nbclient import NotebookClient

from connector.cluster import LocalCluster

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "explore.ipynb"


def outputs(notebook, output_type: str) -> list:
    return [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == output_type]


def stdout(notebook) -> str:
    return "".join(o.text for o in outputs(notebook, "stream") if o.name == "stdout")


def images(notebook) -> list:
    return [o for kind in ("display_data", "execute_result") for o in outputs(notebook, kind) if "image/png" in o.data]


def test_committed_notebook_has_its_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count and cell.outputs for cell in code), "run the notebook and commit it with outputs"
    assert not outputs(notebook, "error")
    assert len(images(notebook)) >= 2 and "every acknowledged row came back" in stdout(notebook)


def test_notebook_executes_cleanly(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel starts its own cluster (no LEDGER_METADATA), under tmp_path, and its own Spark (not the
    # gateway of a SparkSession this test process may hold).
    env = {k: v for k, v in os.environ.items() if k != "LEDGER_METADATA" and not k.startswith("PYSPARK_GATEWAY_")}
    env["TMPDIR"] = str(tmp_path)
    client = NotebookClient(notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute(env=env)
    finally:
        nbformat.write(notebook, tmp_path / NOTEBOOK.name)
        for leftover in tmp_path.glob("ledger-explore-*/cluster.json"):  # the notebook failed before its last cell
            LocalCluster(leftover.parent).stop()
    text = stdout(notebook)
    assert not outputs(notebook, "error")
    assert f"kernel python: {sys.executable}" in text
    assert "started a local cluster: zk://" in text
    assert "rows of the crashed writer read back: 5,000 of 5,000; stream: 45,000 of 45,000 rows, misplaced 0" in text
    assert "the zombie's next append: LedgerFencedError" in text
    assert len(images(notebook)) == 2
    assert "stopped the local cluster" in text
    assert not list(tmp_path.glob("ledger-explore-*")), "the notebook removes the cluster it started"

# Sourced by the other scripts: create .venv and install the project with its pinned dependencies.
# Re-installs only when setup.cfg, pyproject.toml or constraints.txt changed since the last install. The
# editable install is in compat mode (a path entry, like a real install), so Spark's lookup of pyspark_*
# modules finds pyspark_ledger.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
command -v java >/dev/null 2>&1 || { echo "Java 17 is required (java not found on PATH)" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
STAMP=.venv/.installed
WANT="$(cat setup.cfg pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip==24.3.1
    .venv/bin/python -m pip install --quiet -c constraints.txt --config-settings editable_mode=compat -e ".[test]"
    echo "$WANT" > "$STAMP"
fi
# Bytecode for this project's own modules, as pip gives a non-editable install: otherwise every new Python process
# (each Spark Python worker) compiles them again while PYTHONDONTWRITEBYTECODE is set or the checkout is read-only,
# about 40 ms of each worker's start. Quick when they are up to date.
.venv/bin/python -m compileall -q -j 0 connector metadata protos storage_node pyspark_ledger.py > /dev/null \
    || echo "bootstrap: going on; this project's modules are compiled by each process that imports them" >&2
# Spark's Python workers import PySpark and Py4J from pyspark.zip and py4j-*-src.zip, compiling them at every start
# unless they have bytecode (connector/spark/worker_archive.py); quick when they have.
.venv/bin/ledger spark compile > /dev/null \
    || echo "bootstrap: going on; each Spark Python worker compiles PySpark and Py4J" >&2
export PATH="$ROOT/.venv/bin:$PATH"
export PYSPARK_PYTHON="$ROOT/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$ROOT/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1   # keep Spark on loopback

"""Bytecode for the archives that Spark puts first on every Python worker's path: pyspark.zip and py4j's.

Spark starts each Python worker with PYTHONPATH=$SPARK_HOME/python/lib/pyspark.zip:$SPARK_HOME/python/lib/py4j-*-src.zip
(PythonUtils.sparkPythonPath), so a worker imports PySpark and Py4J from those archives even where both are
pip-installed and compiled in site-packages. The archives hold sources only and Python cannot write bytecode into a
zip, so every worker compiles them again: here 0.9 s of CPU for a worker that needs 0.3 s, of which Py4J's modules
(imported by every worker: pyspark.daemon imports them before it forks one) about 35 ms (measured in the README).
Spark starts a fresh worker for each planning call of a Python Data Source (schema, reader, partitions, writer,
commit) and for each streaming query's source, and gives it 10 s to connect back (a constant in
PythonWorkerFactory): on a loaded machine the compiling can take a worker past that, and the query fails with
"Python worker failed to connect back".

add_bytecode writes an archive again with a .pyc beside each .py (the place zipimport looks for one), each checked
against the hash of its source (PEP 552), so a source changed in the archive is compiled again, never served stale;
a .pyc of another Python version is ignored by the worker (its magic number differs) and replaced by add_bytecode
(so run it with the Python the workers run, PYSPARK_PYTHON). The sources stay in the archive as they were; the
tests' sources under */tests/ are not compiled (no worker imports them). The new archive replaces the old one
atomically, but a Python process already importing from the old archive keeps its table of contents: run it while
no Spark application runs (scripts/bootstrap.sh runs it on install).
"""
from __future__ import annotations

import importlib.util
import marshal
import os
import tempfile
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

from connector.spark.errors import WorkerArchiveError

LIB = Path("python", "lib")                        # under SPARK_HOME
ARCHIVE = LIB / "pyspark.zip"
PY4J_ARCHIVES = "py4j-*-src.zip"                   # in LIB, the name carries Py4J's version
CHECKED_HASH = (0b11).to_bytes(4, "little")       # PEP 552 flags: hash-based, checked against the source


@dataclass(frozen=True)
class Compiled:
    archive: Path
    modules: int          # sources in the archive that now have bytecode of this Python
    added: int            # of which this call compiled (0: the archive had them all; else all of them)


def spark_home() -> Path:
    """$SPARK_HOME, else the pip-installed PySpark's package directory (the SPARK_HOME its launcher sets; found
    without importing PySpark)."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        spec = importlib.util.find_spec("pyspark")
        if spec is None or spec.origin is None:
            raise WorkerArchiveError("PySpark is not installed in this Python and SPARK_HOME is not set: run it with "
                                     "the Python Spark's workers run, or give --archive the pyspark.zip and the "
                                     "py4j-*-src.zip to compile")
        home = Path(spec.origin).parent
    return Path(home)


def spark_archives(home: Path) -> list[Path]:
    """The archives Spark puts on a worker's path from this Spark home: its pyspark.zip (listed whether or not it
    exists: the caller names a missing one) and the py4j-*-src.zip beside it."""
    return [home / ARCHIVE, *sorted((home / LIB).glob(PY4J_ARCHIVES))]


def add_bytecode(archive: Path) -> Compiled:
    """Give every source in `archive` (but tests) a checked .pyc of this Python; write the archive only if needed."""
    try:
        with zipfile.ZipFile(archive) as source:
            entries = source.infolist()
            names = {info.filename for info in entries}
            wanted = [info for info in entries if _compiles(info.filename)]
            if all(_current(source, info.filename, names) for info in wanted):
                return Compiled(archive, len(wanted), 0)
            _write(archive, source, entries, wanted)
    except PermissionError as exc:
        raise WorkerArchiveError(f"cannot add bytecode to {archive}: {exc}. Run it as a user who may read it and write "
                                 f"{archive.parent} (the archive is written beside it, then renamed)") from exc
    # zipfile raises NotImplementedError for a compression method it cannot read, ValueError for a malformed entry.
    except (OSError, zipfile.BadZipFile, NotImplementedError, ValueError) as exc:
        raise WorkerArchiveError(f"cannot add bytecode to {archive}: {exc}. Give --archive the archives of the "
                                 f"Spark installation (SPARK_HOME/{ARCHIVE} and SPARK_HOME/{LIB / PY4J_ARCHIVES})"
                                 ) from exc
    return Compiled(archive, len(wanted), len(wanted))


def _compiles(name: str) -> bool:
    return name.endswith(".py") and "/tests/" not in f"/{name}"


def _header(source_bytes: bytes) -> bytes:
    """The first 16 bytes of a .pyc of this Python checked against `source_bytes` (PEP 552)."""
    return importlib.util.MAGIC_NUMBER + CHECKED_HASH + importlib.util.source_hash(source_bytes)


def _current(source: zipfile.ZipFile, name: str, names: set[str]) -> bool:
    """Whether the .pyc beside `name` is one this Python loads for the source as it is now (not another
    Python's, not stale, not timestamp-based: zipimport would compile the source again for any of those)."""
    if name + "c" not in names:
        return False
    with source.open(name + "c") as f:
        return f.read(16) == _header(source.read(name))


def _write(archive: Path, source: zipfile.ZipFile, entries: list[zipfile.ZipInfo],
           wanted: list[zipfile.ZipInfo]) -> None:
    compiled = {info.filename + "c" for info in wanted}
    fd, tmp = tempfile.mkstemp(prefix=f".{archive.stem}-", suffix=".zip.tmp", dir=archive.parent)
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(out, "w") as target:
            for info in entries:
                if info.filename in compiled:
                    continue   # a .pyc beside a source (another Python's, stale, or ours): written again below
                data = source.read(info)
                target.writestr(info, data)
                if info.filename + "c" in compiled:
                    pyc = zipfile.ZipInfo(info.filename + "c", info.date_time)   # stored: read at every import
                    target.writestr(pyc, _header(data) + marshal.dumps(_code(archive, info.filename, data)))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, archive.stat().st_mode & 0o777)
        os.replace(tmp, archive)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _code(archive: Path, name: str, data: bytes):
    """`name`'s code as zipimport compiles it (its file name: tracebacks name the archive), asserts kept whatever
    this Python's -O (a worker loads the .pyc whatever its own)."""
    with warnings.catch_warnings():   # the sources' own SyntaxWarnings: not ours to print
        warnings.simplefilter("ignore")
        try:
            return compile(data, f"{archive.absolute()}/{name}", "exec", dont_inherit=True, optimize=0)
        except (SyntaxError, ValueError) as exc:   # ValueError: a NUL byte in the source
            where = f", line {exc.lineno}" if getattr(exc, "lineno", None) else ""
            reason = getattr(exc, "msg", None) or str(exc)
            raise WorkerArchiveError(f"cannot add bytecode to {archive}: {name} does not compile ({reason}{where}); "
                                     f"the archive was left as it was. Reinstall PySpark to restore its sources"
                                     ) from exc

"""`ledger spark compile`: bytecode in a pyspark.zip-like archive that a fresh Python imports, never stale, never
half-written (connector/spark/worker_archive.py). The archives here are small ones of our own; that the Spark
workers of the test session import PySpark compiled is tests/spark/test_worker_archive.py."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile

import pytest

from connector import cli
from connector.spark.errors import WorkerArchiveError
from connector.spark.worker_archive import add_bytecode

SOURCES = {
    "pkg/__init__.py": b"",
    "pkg/mod.py": b"VALUE = 'first'\n",
    "pkg/sub/__init__.py": b"# -*- coding: latin-1 -*-\nNAME = '\xe9t\xe9'\n",
    "pkg/tests/test_mod.py": b"def test(): assert 1 is 1\n",   # a SyntaxWarning, and never imported by a worker
    "pkg/data.json": b"{}",
}


def make_archive(path, sources=SOURCES, extra=()):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in [*sources.items(), *extra]:
            archive.writestr(name, data)
    return path


def imported(archive, *modules):
    """What a fresh Python with only `archive` on its path (as a Spark worker) makes of `modules`."""
    code = ("import importlib, json, sys; mods = [importlib.import_module(m) for m in sys.argv[1:]]; "
            "print(json.dumps([[m.__file__, getattr(m, 'VALUE', getattr(m, 'NAME', None))] for m in mods]))")
    done = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(archive), "PYTHONDONTWRITEBYTECODE": "1"}, check=True)
    return json.loads(done.stdout)


def entries(archive):
    with zipfile.ZipFile(archive) as z:
        return {name: z.read(name) for name in z.namelist()}


def test_every_source_but_the_tests_gets_bytecode_that_a_fresh_python_imports(tmp_path):
    archive = make_archive(tmp_path / "pyspark.zip")
    archive.chmod(0o640)
    assert imported(archive, "pkg.mod") == [[f"{archive}/pkg/mod.py", "first"]]   # compiled at every import

    done = add_bytecode(archive)

    assert (done.modules, done.added) == (3, 3)
    after = entries(archive)
    assert {name: after[name] for name in SOURCES} == SOURCES   # the sources as they were
    assert sorted(set(after) - set(SOURCES)) == ["pkg/__init__.pyc", "pkg/mod.pyc", "pkg/sub/__init__.pyc"]
    assert all(after[name][:4] == importlib.util.MAGIC_NUMBER for name in after if name.endswith(".pyc"))
    assert imported(archive, "pkg.mod", "pkg.sub") == [
        [f"{archive}/pkg/mod.pyc", "first"], [f"{archive}/pkg/sub/__init__.pyc", "\u00e9t\u00e9"]]
    assert archive.stat().st_mode & 0o777 == 0o640


def test_a_second_run_writes_nothing(tmp_path):
    archive = make_archive(tmp_path / "pyspark.zip")
    add_bytecode(archive)
    written = archive.stat().st_mtime_ns, archive.read_bytes()

    assert add_bytecode(archive).added == 0
    assert (archive.stat().st_mtime_ns, archive.read_bytes()) == written


def test_a_source_changed_after_compiling_is_imported_as_it_is_now_and_compiled_again(tmp_path):
    archive = make_archive(tmp_path / "pyspark.zip")
    add_bytecode(archive)
    changed = entries(archive) | {"pkg/mod.py": b"VALUE = 'second'\n"}   # the old pkg/mod.pyc kept
    make_archive(archive, changed)

    assert imported(archive, "pkg.mod") == [[f"{archive}/pkg/mod.py", "second"]]   # compiled, as before

    assert add_bytecode(archive).added == 3   # the stale .pyc is found and written again
    assert imported(archive, "pkg.mod") == [[f"{archive}/pkg/mod.pyc", "second"]]


def test_bytecode_of_another_python_is_compiled_again(tmp_path):
    archive = make_archive(tmp_path / "pyspark.zip")
    add_bytecode(archive)
    other = dict(entries(archive))
    other["pkg/mod.pyc"] = b"\x00\x00\r\n" + other["pkg/mod.pyc"][4:]   # another magic number
    make_archive(archive, other)

    assert add_bytecode(archive).added == 3
    assert entries(archive)["pkg/mod.pyc"][:4] == importlib.util.MAGIC_NUMBER
    assert sorted(entries(archive)) == sorted(other)   # each .pyc once
    assert imported(archive, "pkg.mod") == [[f"{archive}/pkg/mod.pyc", "first"]]


@pytest.mark.parametrize("broken, reason", [(b"def (:\n", r"invalid syntax, line 1"),
                                            (b"x = 1\0\n", r"source code string cannot contain null bytes")])
def test_a_source_that_does_not_compile_leaves_the_archive_as_it_was(tmp_path, broken, reason):
    archive = make_archive(tmp_path / "pyspark.zip", extra=[("pkg/broken.py", broken)])
    before = archive.read_bytes()

    with pytest.raises(WorkerArchiveError, match=rf"cannot add bytecode to .*pyspark.zip: pkg/broken.py does not "
                                                 rf"compile \({reason}\); the archive was left as it was"):
        add_bytecode(archive)
    assert archive.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["pyspark.zip"]   # no temporary file left


@pytest.mark.parametrize("what", ["missing", "not a zip", "a directory"])
def test_the_command_names_a_path_that_is_no_archive_and_changes_nothing(tmp_path, capsys, what):
    path = {"missing": tmp_path / "nothing.zip", "not a zip": tmp_path / "notes.txt", "a directory": tmp_path}[what]
    if what == "not a zip":
        path.write_text("not an archive")

    assert cli.main(["spark", "compile", "--archive", str(path)]) == 1

    error = capsys.readouterr().err
    assert error.startswith(f"ledger: error: cannot add bytecode to {path}: ")
    assert ("Give --archive the archives of the Spark installation (SPARK_HOME/python/lib/pyspark.zip and "
            "SPARK_HOME/python/lib/py4j-*-src.zip)") in error
    assert "Traceback" not in error
    assert sorted(p.name for p in tmp_path.iterdir()) == (["notes.txt"] if what == "not a zip" else [])


def test_the_command_says_what_it_did(tmp_path, capsys):
    archive = make_archive(tmp_path / "pyspark.zip")

    assert cli.main(["spark", "compile", "--archive", str(archive)]) == 0
    assert cli.main(["spark", "compile", "--archive", str(archive)]) == 0

    assert capsys.readouterr().out.splitlines() == [
        f"{archive}: compiled 3 of its 3 modules for this Python",
        f"{archive}: its 3 modules have bytecode for this Python already"]


def test_a_spark_home_without_the_archive_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))

    assert cli.main(["spark", "compile"]) == 1

    archive = tmp_path / "python" / "lib" / "pyspark.zip"
    assert capsys.readouterr().err == (f"ledger: error: {archive} does not exist: is SPARK_HOME ({tmp_path}) the "
                                       f"Spark installation? Give --archive its pyspark.zip and py4j-*-src.zip\n")


def test_the_command_compiles_the_spark_homes_pyspark_and_py4j_archives(tmp_path, capsys, monkeypatch):
    lib = tmp_path / "python" / "lib"
    lib.mkdir(parents=True)
    pyspark_zip = make_archive(lib / "pyspark.zip")
    py4j_zip = make_archive(lib / "py4j-0.10.9.9-src.zip", {"py4j/__init__.py": b"VALUE = 'gateway'\n"})
    (lib / "PY4J_LICENSE.txt").write_text("not an archive")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))

    assert cli.main(["spark", "compile"]) == 0

    assert capsys.readouterr().out.splitlines() == [
        f"{pyspark_zip}: compiled 3 of its 3 modules for this Python",
        f"{py4j_zip}: compiled 1 of its 1 modules for this Python"]
    path = f"{pyspark_zip}:{py4j_zip}"   # a worker's path, as Spark sets it
    assert imported(path, "pkg.mod", "py4j") == [[f"{pyspark_zip}/pkg/mod.pyc", "first"],
                                                 [f"{py4j_zip}/py4j/__init__.pyc", "gateway"]]


def test_the_command_compiles_each_archive_it_is_given(tmp_path, capsys):
    first = make_archive(tmp_path / "pyspark.zip")
    second = make_archive(tmp_path / "py4j-src.zip", {"py4j/__init__.py": b""})

    assert cli.main(["spark", "compile", "--archive", str(first), "--archive", str(second)]) == 0

    assert capsys.readouterr().out.splitlines() == [f"{first}: compiled 3 of its 3 modules for this Python",
                                                    f"{second}: compiled 1 of its 1 modules for this Python"]


def test_a_spark_home_without_py4js_archive_compiles_pyspark_zip_and_says_so(tmp_path, capsys, monkeypatch):
    lib = tmp_path / "python" / "lib"
    lib.mkdir(parents=True)
    pyspark_zip = make_archive(lib / "pyspark.zip")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))

    assert cli.main(["spark", "compile"]) == 0

    assert capsys.readouterr().out.splitlines() == [
        f"{lib} holds no py4j-*-src.zip: Spark's Python workers import Py4J from elsewhere; compiling pyspark.zip only",
        f"{pyspark_zip}: compiled 3 of its 3 modules for this Python"]

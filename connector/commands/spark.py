"""`ledger spark compile [--archive PATH ...]`: bytecode for the archives every Spark Python worker imports PySpark
and Py4J from.

Spark puts $SPARK_HOME/python/lib/pyspark.zip and py4j-*-src.zip first on each Python worker's path, and a zip of
sources is compiled again by every worker that starts (connector/spark/worker_archive.py). Run once after installing
or upgrading PySpark, while no Spark application runs; scripts/bootstrap.sh does it for the project's virtualenv.
"""
from __future__ import annotations

import os
import pathlib


def register(subparsers) -> None:
    spark = subparsers.add_parser("spark", help="set up the Spark installation the connector runs in")
    commands = spark.add_subparsers(dest="spark_command", required=True)
    compile_ = commands.add_parser(
        "compile", help="add bytecode to pyspark.zip and py4j's archive so Spark's Python workers do not compile "
                        "them at each start",
        description="Add a .pyc beside each source in pyspark.zip and py4j-*-src.zip, which Spark puts first on "
                    "every Python worker's path: each worker that starts then imports PySpark and Py4J without "
                    "compiling them (Spark starts one for every planning call of a Python Data Source). Run it "
                    "after installing or upgrading PySpark, while no Spark application runs.")
    compile_.add_argument("--archive", type=pathlib.Path, action="append",
                          help="an archive to compile, instead of the Spark installation's; may be given more than "
                               "once (default: pyspark.zip and py4j-*-src.zip in $SPARK_HOME/python/lib, else in "
                               "the installed PySpark's)")
    compile_.set_defaults(func=run_compile)


def run_compile(args) -> int:
    from connector.spark.errors import WorkerArchiveError
    from connector.spark.worker_archive import add_bytecode, spark_archives, spark_home

    archives = args.archive
    if archives is None:
        home = spark_home()
        archives = spark_archives(home)
        if not archives[0].exists():
            if os.environ.get("SPARK_HOME"):
                raise WorkerArchiveError(f"{archives[0]} does not exist: is SPARK_HOME ({home}) the Spark "
                                         f"installation? Give --archive its pyspark.zip and py4j-*-src.zip")
            print(f"{archives[0]} does not exist: Spark's Python workers import the installed PySpark; nothing to "
                  f"compile")
            return 0
        if len(archives) == 1:
            print(f"{archives[0].parent} holds no py4j-*-src.zip: Spark's Python workers import Py4J from elsewhere; "
                  f"compiling pyspark.zip only")
    for archive in archives:
        done = add_bytecode(archive)
        if done.added:
            print(f"{done.archive}: compiled {done.added} of its {done.modules} modules for this Python")
        else:
            print(f"{done.archive}: its {done.modules} modules have bytecode for this Python already")
    return 0

"""`python -m connector.spark.driver_keeper`: the process that holds a Spark driver's liveness registration
for as long as the driver's JVM lives (see driver.py, which starts it; not a command for people)."""
from __future__ import annotations

import argparse
import logging
import pathlib
import sys

from connector.spark.driver import IDLE_SECONDS, DriverProcess, KeeperFiles, keep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="hold a Spark driver's liveness registration (internal)")
    parser.add_argument("--driver-id", required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--create-time", type=float, required=True)
    parser.add_argument("--files", required=True)
    parser.add_argument("--idle-seconds", type=float, default=IDLE_SECONDS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    files = KeeperFiles(pathlib.Path(args.files))
    return keep(args.driver_id, DriverProcess(args.pid, args.create_time), files, args.idle_seconds)


if __name__ == "__main__":
    sys.exit(main())

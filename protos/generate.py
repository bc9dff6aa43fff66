"""Regenerate the Python gRPC code from ledger.proto: ``python -m protos.generate``.

``--check`` compares freshly generated code with the committed files and exits 1 when they are stale.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

from grpc_tools import protoc

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
GENERATED = ("ledger_pb2.py", "ledger_pb2.pyi", "ledger_pb2_grpc.py")


def generate(out_dir: pathlib.Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(HERE / "ledger.proto"),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed on protos/ledger.proto")


def stale_files() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        generate(pathlib.Path(tmp))
        fresh = pathlib.Path(tmp) / "protos"
        return [
            name
            for name in GENERATED
            if not (HERE / name).exists() or (HERE / name).read_bytes() != (fresh / name).read_bytes()
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"stale generated code: {', '.join(stale)}; run: python -m protos.generate", file=sys.stderr)
            return 1
        return 0
    generate(ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())

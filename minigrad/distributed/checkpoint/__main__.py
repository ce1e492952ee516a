"""``python -m minigrad.distributed.checkpoint consolidate DIR OUT.safetensors [--prefix model]``:
turn a sharded checkpoint into one full-weights file (see :mod:`.consolidate`)."""

from __future__ import annotations

import argparse
import sys

from minigrad.distributed.checkpoint.consolidate import consolidate
from minigrad.serialization import CheckpointError


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run it; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m minigrad.distributed.checkpoint")
    commands = parser.add_subparsers(dest="command", required=True)
    merge = commands.add_parser("consolidate", help="one full-weights safetensors file")
    merge.add_argument("directory", help="a checkpoint directory (with index.json)")
    merge.add_argument("out", help="the safetensors file to write")
    merge.add_argument("--prefix", default=None,
                       help="keep only the tensors under this state key (e.g. model), unprefixed")
    args = parser.parse_args(argv)
    try:
        names = consolidate(args.directory, args.out, args.prefix)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(names)} tensors to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

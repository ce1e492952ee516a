"""``python -m minigrad.distributed.launch``: torchrun's command, kept at the path users type.

The launcher itself is :mod:`minigrad.distributed.runtime.launch`; this file only makes the
command line ``python -m minigrad.distributed.launch --nproc_per_node 2 train.py`` work.
"""

import sys

from minigrad.distributed.runtime.launch import main

if __name__ == "__main__":
    sys.exit(main())

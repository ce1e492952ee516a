"""``python -m minigrad.distributed.flight_recorder DIR``: the cross-rank analysis of a job's
flight-recorder dumps, the command path users type. The recorder itself is
:mod:`minigrad.distributed.comm.recorder`."""

import sys

from minigrad.distributed.comm.recorder import main

if __name__ == "__main__":
    sys.exit(main())

"""A training script for the elastic tests: ``python -m minigrad.distributed.launch
--nproc_per_node 2 --max_restarts 2 elastic_train.py ROOT STOP KILL_AT OUT``.

Data-parallel training of the helper MLP, a checkpoint after every step, resuming from
``dist.checkpoint.latest(ROOT)``; on the first start (``MINIGRAD_RESTART_COUNT`` 0) rank 1 kills
itself with SIGKILL before step ``KILL_AT`` (-1: never). Rank 0 writes the final parameters,
the restart count and the step it resumed from to ``OUT`` (npz)."""

import os
import signal
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from layouts import Run  # noqa: E402

import minigrad.distributed as dist  # noqa: E402


def main():
    root, stop, kill_at, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group()
    restart = int(os.environ["MINIGRAD_RESTART_COUNT"])
    job = Run("data2")
    state, _ = job.resume(root)
    resumed_from = state["step"]
    for step in range(state["step"], stop):
        if restart == 0 and step == kill_at and dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        job.step(step)
        state["step"] = step + 1
        dist.checkpoint.save(state, os.path.join(root, f"step-{step + 1}"))
    params = {k: np.asarray(v) for k, v in job.model.state_dict().items()}
    if dist.get_rank() == 0:
        np.savez(out, restart=restart, resumed_from=resumed_from, **params)


if __name__ == "__main__":
    main()

"""Data parallelism in the style of OneFlow's DDP tutorial, on minigrad.

Each of the two ranks fits its own shard of a linear regression (y = 2*x0 + 3*x1) for 500 iterations
through ``DistributedDataParallel``; gradients are averaged across ranks, so both ranks end with the
same weights, close to [2, 3]. Launch it like a torchrun/OneFlow script:

    python -m minigrad.distributed.launch --nproc_per_node 2 examples/oneflow_ddp.py
"""

import numpy as np

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim

SHARDS_X = [np.array([[1.0, 2.0], [2.0, 1.0]]), np.array([[3.0, 5.0], [4.0, 2.0]])]
SHARDS_Y = [x @ np.array([[2.0], [3.0]]) for x in SHARDS_X]


class Model(M.Module):
    def __init__(self):
        super().__init__()
        self.lr = 0.005
        self.iter_count = 500
        self.w = mg.Parameter(np.zeros((2, 1), dtype=np.float32))

    def forward(self, x):
        return F.matmul(x, self.w)


def main(iterations: int | None = None):
    dist.init_process_group()  # reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
    rank = dist.get_rank()
    model = Model()
    ddp = dist.DistributedDataParallel(model)
    gm = ad.GradManager().attach(ddp.parameters())
    opt = optim.SGD(ddp.parameters(), lr=model.lr)
    x = mg.tensor(SHARDS_X[rank % 2], dtype="float32")
    y = mg.tensor(SHARDS_Y[rank % 2], dtype="float32")
    n = iterations or model.iter_count
    for i in range(n):
        with gm:
            loss = F.nn.square_loss(ddp(x), y, reduction="sum")
            gm.backward(loss)
        opt.step().clear_grad()
        if (i + 1) % 50 == 0:
            print(f"rank {rank}: {i + 1}/{n} loss {loss.item():.6f}", flush=True)
    w = model.w.numpy().ravel()
    print(f"rank {rank}: w = {w}", flush=True)
    return w


if __name__ == "__main__":
    main()

"""OneFlow's pipeline-parallelism tutorial program, run by minigrad.

The program below is the one of OneFlow's tutorial ("Pipelining parallelism"): two stage modules
placed on rank 0 and rank 1 with broadcast SBP, the activation moved between them with
``to_global``, and an ``nn.Graph`` that runs each batch as 2 micro-batches through the 1F1B
pipeline schedule, accumulates the gradients of the mean micro-batch loss and steps SGD. Only these
lines differ from OneFlow's: the imports, ``flow.`` spelled as minigrad's module paths, ``"cuda"``
spelled ``"cpu"``, and ``module.to(nn.graph.GraphModule).set_stage(...)`` spelled
``self.set_stage(module, ...)``, plus a check that stops with the command to run when the
program was started without its 2 ranks. It prints each step's loss on rank 1 (the last stage;
rank 0 prints empty tensors, as in OneFlow) and writes no files.

    python -m minigrad.distributed.launch --nproc_per_node 2 examples/global_tensor_pipeline.py
"""

import os
import sys

import minigrad as mg
import minigrad.distributed
import minigrad.module
import minigrad.optimizer

# not in OneFlow's program: started without its 2 ranks, say in one line how to start them
if max(mg.distributed.get_world_size(), int(os.environ.get("WORLD_SIZE", "1"))) < 2:
    sys.exit(f"{sys.argv[0]} needs 2 ranks; run: python -m minigrad.distributed.launch "
             f"--nproc_per_node 2 {sys.argv[0]}")

BATCH_SIZE = 16
BROADCAST = [mg.sbp.broadcast]
P0 = mg.placement("cpu", [0])
P1 = mg.placement("cpu", [1])


class Stage0Module(mg.module.Module):
    def __init__(self):
        super().__init__()
        self.flatten = mg.module.Flatten()
        self.linear0 = mg.module.Linear(28*28, 512)
        self.relu0 = mg.module.ReLU()

    def forward(self, x):
        out = self.flatten(x)
        out = self.linear0(out)
        out = self.relu0(out)
        return out


class Stage1Module(mg.module.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = mg.module.Linear(512, 512)
        self.relu1 = mg.module.ReLU()
        self.linear2 = mg.module.Linear(512, 10)
        self.relu2 = mg.module.ReLU()

    def forward(self, x):
        out = self.linear1(x)
        out = self.relu1(out)
        out = self.linear2(out)
        out = self.relu2(out)
        return out


class PipelineModule(mg.module.Module):
    def __init__(self):
        super().__init__()
        self.m_stage0 = Stage0Module()
        self.m_stage1 = Stage1Module()

        self.m_stage0.to_global(placement=P0, sbp=BROADCAST)
        self.m_stage1.to_global(placement=P1, sbp=BROADCAST)

    def forward(self, x):
        out_stage0 = self.m_stage0(x)
        in_stage1 = out_stage0.to_global(placement=P1, sbp=BROADCAST)
        out_stage1 = self.m_stage1(in_stage1)
        return out_stage1


module_pipeline = PipelineModule()
sgd = mg.optimizer.SGD(module_pipeline.parameters(), lr=0.001)


class PipelineGraph(mg.Graph):
    def __init__(self):
        super().__init__()
        self.module_pipeline = module_pipeline
        self.set_stage(self.module_pipeline.m_stage0, stage_id=0, placement=P0)
        self.set_stage(self.module_pipeline.m_stage1, stage_id=1, placement=P1)
        self.loss_fn = mg.module.CrossEntropyLoss()
        self.config.set_gradient_accumulation_steps(2)
        self.add_optimizer(sgd)

    def build(self, x, y):
        out = self.module_pipeline(x)
        loss = self.loss_fn(out, y)
        loss.backward()
        return loss


graph_pipeline = PipelineGraph()

x = mg.randn(BATCH_SIZE, 1, 28, 28)
x = x.to_global(P0, BROADCAST)
y = mg.randint(0, 10, (BATCH_SIZE,))
y = y.to_global(P1, BROADCAST)

for i in range(20):  # noqa: B007  (the tutorial's own loop)
    loss = graph_pipeline(x, y)
    print(loss.to_local())

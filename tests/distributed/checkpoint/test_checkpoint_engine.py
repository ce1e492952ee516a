"""DeepSpeed's engine.save_checkpoint / load_checkpoint on the PipelineEngine: tags, latest,
client_state, global_steps; resuming is bitwise; the checkpoint consolidates to one file."""

import numpy as np
from layouts import Run
from safetensors.numpy import load_file

import minigrad.distributed as dist
from minigrad.testing.distributed import run_workers

K, N = 2, 4


def _engine_job(root, stop, save=False, resume=False):
    job = Run("pipe2")
    engine = job.engine
    got = None
    if resume:
        got = engine.load_checkpoint(root)
        assert engine.global_steps == K
    else:
        assert engine.load_checkpoint(root) == (None, None)  # nothing saved yet
    for step in range(engine.global_steps, stop):
        job.step(step)
        if save and engine.global_steps == K:
            path = engine.save_checkpoint(root, client_state={"epoch": 3, "w": np.arange(2.0)})
            assert path.endswith("global_step2")
    params = {k: np.asarray(v) for k, v in engine.module.state_dict().items()}
    return got, params


def test_engine_checkpoint_resumes_bitwise_with_client_state(tmp_path):
    root = str(tmp_path)
    ref = run_workers(_engine_job, 2, root + "/none", N, timeout=120)
    run_workers(_engine_job, 2, root, K, save=True, timeout=120)
    assert (tmp_path / "latest").read_text().strip() == "global_step2"
    out = run_workers(_engine_job, 2, root, N, resume=True, timeout=120)
    for (got, params), (_, expected) in zip(out, ref):
        path, client = got
        assert path == str(tmp_path / "global_step2")
        assert client["epoch"] == 3 and client["w"].tolist() == [0.0, 1.0]
        assert sorted(params) == sorted(expected)
        for k in expected:
            assert np.array_equal(params[k], expected[k]), k
    # the same checkpoint as one full-weights file (the weights after step K)
    full = dist.checkpoint.full_tensors(str(tmp_path / "global_step2"), prefix="module")
    merged = {k: v for _, p in run_workers(_engine_job, 2, root + "/k", K, timeout=120)
              for k, v in p.items()}
    for k, v in merged.items():
        assert np.array_equal(full[k], v), k
    dist.checkpoint.consolidate(str(tmp_path / "global_step2"), str(tmp_path / "w.safetensors"),
                                prefix="module")
    assert sorted(load_file(str(tmp_path / "w.safetensors"))) == sorted(merged)

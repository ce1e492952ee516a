"""DeepSpeed's engine.save_checkpoint / load_checkpoint on the PipelineEngine: tags, latest,
client_state, global_steps; resuming is bitwise; the checkpoint consolidates to one file."""

import numpy as np
from ckpt_helpers import BATCH, batch
from layouts import Run, _layers, _mse
from safetensors.numpy import load_file

import minigrad.distributed as dist
import minigrad.optimizer as optim
from minigrad.distributed.mesh.topology import PipeDataParallelTopology
from minigrad.distributed.pipeline import PipelineEngine, PipelineModule
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


def _pipe_job(root, stop, zero, save=False, resume=False):
    """Pipeline 2 x data 2 with ZeRO-1 over the data axis (``zero``), or the plain pipeline 2;
    both train on the same global batches (2 micro-batches per replica)."""
    if zero:
        net = PipelineModule(_layers(), topology=PipeDataParallelTopology(2, 2), loss_fn=_mse)
        engine = PipelineEngine(net, optim.Adam(list(net.parameters()), lr=0.01), 2, "1f1b",
                                zero_stage=1)
        replica, replicas = net.topology.get_coord(dist.get_rank()).data, 2
    else:
        engine, replica, replicas = Run("pipe2").engine, 0, 1
    if resume:
        engine.load_checkpoint(root)
    for step in range(engine.global_steps, stop):
        x, y = batch(step)
        rows = BATCH // replicas
        x, y = x[replica * rows:(replica + 1) * rows], y[replica * rows:(replica + 1) * rows]
        half = rows // 2
        engine.train_batch(iter([(x[:half], y[:half]), (x[half:], y[half:])]))
        if save and engine.global_steps == K:
            engine.save_checkpoint(root)
    return {k: np.asarray(v) for k, v in engine.module.state_dict().items()}


def _merged(results):
    return {k: v for params in results for k, v in params.items()}


def test_pipeline_zero1_checkpoint_resumes_without_zero(tmp_path):
    """Pipeline 2 x data 2 with ZeRO-1 saves its optimizer state as each data rank's slices; it
    resumes as a plain pipeline 2 and ends where an uninterrupted pipeline 2 run does."""
    root = str(tmp_path)
    run_workers(_pipe_job, 4, root, K, True, save=True, timeout=120)
    index = dist.checkpoint.read_index(str(tmp_path / "global_step2"))
    moments = {k: m for k, m in index["tensors"].items() if k.endswith("/exp_avg")}
    assert moments and all(len(m["pieces"]) >= 1 for m in moments.values())
    assert len({p["file"] for m in moments.values() for p in m["pieces"]}) == 4  # every rank
    got = _merged(run_workers(_pipe_job, 2, root, N, False, resume=True, timeout=120))
    ref = _merged(run_workers(_pipe_job, 2, root + "/none", N, False, timeout=120))
    assert sorted(got) == sorted(ref)
    for k, v in ref.items():
        np.testing.assert_allclose(got[k], v, rtol=0, atol=1e-10, err_msg=k)


def _scaled_engine_job(root, stop, resume=False):
    import minigrad.amp as amp
    import minigrad.functional as F
    import minigrad.module as M
    from minigrad.distributed.pipeline import LayerSpec

    net = PipelineModule([LayerSpec(M.Linear, 3, 3), LayerSpec(M.Linear, 3, 3)], num_stages=2,
                         loss_fn=F.nn.cross_entropy, partition_method="uniform")
    scaler = amp.GradScaler(init_scale=8.0, growth_interval=1)  # doubles after every clean step
    engine = PipelineEngine(net, optim.SGD(net.parameters(), lr=0.1), 2, "1f1b", scaler=scaler)
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((2, 3)).astype("float32"), rng.integers(0, 3, 2).astype("int32"))
            for _ in range(2 * N)]
    if resume:
        engine.load_checkpoint(root)
    for step in range(engine.global_steps, stop):
        engine.train_batch(iter(data[2 * step:2 * step + 2]))
    if not resume and stop == K:
        engine.save_checkpoint(root)
    params = {k: np.asarray(v) for k, v in engine.module.state_dict().items()}
    return scaler.state_dict(), params


def test_the_engines_loss_scaler_is_part_of_its_checkpoint(tmp_path):
    root = str(tmp_path)
    ref = run_workers(_scaled_engine_job, 2, root + "/none", N, timeout=120)
    run_workers(_scaled_engine_job, 2, root, K, timeout=120)
    out = run_workers(_scaled_engine_job, 2, root, N, resume=True, timeout=120)
    for (scaler_state, params), (ref_state, ref_params) in zip(out, ref):
        assert scaler_state == ref_state  # the scale went on growing from the saved one
        for k in ref_params:
            assert np.array_equal(params[k], ref_params[k]), k

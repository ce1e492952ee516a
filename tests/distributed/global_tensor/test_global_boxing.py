"""Boxing: every (source, destination) SBP pair on 2, 3 and 4 ranks and on a 2 x 2 mesh, with
shapes that split unevenly: the logical value is unchanged, each 1-D pair uses exactly the
collective of OneFlow's table (counted), and the gradient equals the single-process one. Plus
changes of placement (who sends, who receives). One launched job per world size."""

import itertools

import numpy as np
import pytest
from global_tensor_helpers import SBP_NAMES, CallCounter, assemble, make_global, sbp_of

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
from minigrad.distributed.global_tensor import set_lockstep_check
from minigrad.testing.distributed import run_workers

SHAPE = (5, 7)  # uneven over 2, 3 and 4 ranks on both axes
EXPECTED = {  # OneFlow's boxing table: the one collective each 1-D pair uses
    ("P", "B"): {"all_reduce_sum": 1},
    ("P", "S0"): {"reduce_scatter_sum": 1},
    ("P", "S1"): {"reduce_scatter_sum": 1},
    ("S0", "B"): {"all_gather": 1},
    ("S1", "B"): {"all_gather": 1},
    ("S0", "S1"): {"all_to_all": 1},
    ("S1", "S0"): {"all_to_all": 1},
}
BACKWARD = {  # the adjoint collective, for pairs whose other backward steps need none
    ("S0", "B"): {"reduce_scatter_sum": 1},
    ("S0", "S1"): {"all_to_all": 1},
    ("P", "B"): {"all_reduce_sum": 1},
    ("P", "S0"): {"all_gather": 1},
}


def _x():
    return np.random.default_rng(0).standard_normal(SHAPE)


def _w():
    return np.random.default_rng(1).standard_normal(SHAPE)


def _expected_grad():
    """d/dx sum(sin(x) * w) in one process, with minigrad's ordinary tensors."""
    x = mg.tensor(_x(), dtype="float64")
    gm = ad.GradManager().attach([x])
    with gm:
        gm.backward((F.sin(x) * mg.tensor(_w(), dtype="float64")).sum())
    return x.grad.numpy()


def _pairs(names, mesh_ndim):
    layouts = list(itertools.product(names, repeat=mesh_ndim))
    return [(a, b) for a in layouts for b in layouts]


def _with_grad(i: int, mesh_ndim: int) -> bool:
    """Gradients for every 1-D pair; on a 2-D mesh for every 5th of the 256 (the suite stays
    fast; the values of all of them are checked)."""
    return mesh_ndim == 1 or i % 5 == 0


def _run_pairs(mesh):
    """Every pair on the placement ``mesh``: pieces of y, of x.grad, and collective counts."""
    P = mg.placement("cpu", mesh)
    rank = dist.get_rank()
    x_np, w_np = _x(), _w()
    out = {}
    for i, (src, dst) in enumerate(_pairs(SBP_NAMES, P.ndim)):
        x = make_global(x_np, src, P)
        set_lockstep_check(False)  # count the data collectives alone
        with CallCounter() as calls:
            y = x.to_global(sbp=sbp_of(dst))
        set_lockstep_check(True)
        res = {"y": y.to_local().numpy(), "calls": calls.take(), "same": y is x}
        if _with_grad(i, P.ndim):
            gm = ad.GradManager().attach([x])
            with gm:
                y = x.to_global(sbp=sbp_of(dst))
                w = mg.tensor(w_np, dtype="float64", placement=P, sbp=sbp_of(dst))
                gm.backward((F.sin(y) * w).sum())
            res["grad"] = x.grad.to_local().numpy()
            res["grad_sbp"] = x.grad.sbp
        out[(src, dst)] = res
    return rank, out


def _check(results, mesh):
    by_rank = dict(results)
    shape = SHAPE
    grad = _expected_grad()
    ndim = np.asarray(mesh).ndim
    for i, (src, dst) in enumerate(_pairs(SBP_NAMES, ndim)):
        with_grad = _with_grad(i, ndim)
        where = f"{src} -> {dst} on {mesh}"
        pieces = {r: by_rank[r][(src, dst)]["y"] for r in by_rank}
        np.testing.assert_allclose(assemble(pieces, dst, mesh, shape), _x(), rtol=1e-12,
                                   atol=1e-12, err_msg=where)
        for r in by_rank:
            res = by_rank[r][(src, dst)]
            assert res["same"] == (src == dst), where
            if len(src) == 1:
                assert res["calls"] == EXPECTED.get((src[0], dst[0]), {}), (where, r)
            if with_grad:
                assert res["grad_sbp"] == sbp_of(src), where
        if with_grad:
            gpieces = {r: by_rank[r][(src, dst)]["grad"] for r in by_rank}
            np.testing.assert_allclose(assemble(gpieces, src, mesh, shape), grad, rtol=1e-10,
                                       atol=1e-12, err_msg=where)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_pair_on_one_mesh_dimension(n):
    mesh = list(range(n))
    _check(run_workers(_run_pairs, n, mesh, timeout=120), mesh)


def test_every_pair_on_a_2x2_mesh():
    mesh = [[0, 1], [2, 3]]
    _check(run_workers(_run_pairs, 4, mesh, timeout=120), mesh)


def _backward_calls():
    """The collectives of the backward of x.to_global(dst) (loss taken on the local pieces)."""
    P = mg.placement("cpu", [0, 1, 2])
    out = {}
    for (src, dst) in BACKWARD:
        x = make_global(_x(), (src,), P)
        gm = ad.GradManager().attach([x])
        with gm:
            y = x.to_global(sbp=sbp_of(dst)).to_local()
            loss = (y * y).sum()
            set_lockstep_check(False)
            with CallCounter() as calls:
                gm.backward(loss)
            set_lockstep_check(True)
        out[(src, dst)] = calls.take()
    return out


def test_backward_uses_the_adjoint_collective():
    # a broadcast result's local gradient is first checked to agree across the ranks (one
    # all-gather of three numbers per rank: to_local's replicated-gradient check)
    for per_rank in run_workers(_backward_calls, 3):
        for (src, dst), calls in per_rank.items():
            expected = dict(BACKWARD[(src, dst)])
            if dst == "B":
                expected["all_gather"] = expected.get("all_gather", 0) + 1
            assert calls == expected, (src, dst)


def _moves():
    """Changes of placement: values, gradients, and how many sends each rank makes."""
    rank = dist.get_rank()
    out = {}
    cases = [([0, 1], "S0", [2, 3], "S0"), ([0, 1], "B", [1, 2], "B"), ([0], "B", [3], "B"),
             ([0, 1, 2], "P", [3], "B"), ([1, 2], "S1", [0, 1, 2, 3], "S0"),
             ([[0, 1], [2, 3]], ("S0", "B"), [[3, 2], [1, 0]], ("B", "S1"))]
    for src_ranks, src, dst_ranks, dst in cases:
        src, dst = (src,) if isinstance(src, str) else src, (dst,) if isinstance(dst, str) else dst
        ps, pd = mg.placement("cpu", src_ranks), mg.placement("cpu", dst_ranks)
        x = make_global(_x(), src, ps)
        gm = ad.GradManager().attach([x])
        set_lockstep_check(False)
        with gm, CallCounter() as calls:
            y = x.to_global(placement=pd, sbp=sbp_of(dst))
            sends = calls.take().get("send", 0)
            w = mg.tensor(_w(), dtype="float64", placement=pd, sbp=sbp_of(dst))
            gm.backward((F.sin(y) * w).sum())
        set_lockstep_check(True)
        out[str((src_ranks, dst_ranks))] = dict(
            y=y.to_local().numpy(), sends=sends, grad=x.grad.to_local().numpy())
    return rank, out, cases


def test_change_of_placement():
    results = run_workers(_moves, 4, timeout=120)
    grad = _expected_grad()
    by_rank = {r: out for r, out, _ in results}
    cases = results[0][2]
    expected_sends = {  # ranks that leave (or stay at another mesh position) send, once each
        str(([0, 1], [2, 3])): {0: 1, 1: 1},
        str(([0, 1], [1, 2])): {0: 1},
        str(([0], [3])): {0: 1},
        str(([0, 1, 2], [3])): {0: 1},
        str(([1, 2], [0, 1, 2, 3])): {1: 1, 2: 1},
        str(([[0, 1], [2, 3]], [[3, 2], [1, 0]])): {0: 1, 1: 1, 2: 1, 3: 1},
    }
    for src_ranks, src, dst_ranks, dst in cases:
        src, dst = (src,) if isinstance(src, str) else src, (dst,) if isinstance(dst, str) else dst
        key = str((src_ranks, dst_ranks))
        np.testing.assert_allclose(
            assemble({r: by_rank[r][key]["y"] for r in by_rank if r in np.ravel(dst_ranks)},
                     dst, dst_ranks, SHAPE), _x(), rtol=1e-12, atol=1e-12, err_msg=key)
        np.testing.assert_allclose(
            assemble({r: by_rank[r][key]["grad"] for r in by_rank if r in np.ravel(src_ranks)},
                     src, src_ranks, SHAPE), grad, rtol=1e-10, atol=1e-12, err_msg=key)
        for r in by_rank:
            assert by_rank[r][key]["sends"] == expected_sends[key].get(r, 0), (key, r)
            if r not in np.ravel(dst_ranks):
                assert by_rank[r][key]["y"].size == 0, (key, r)

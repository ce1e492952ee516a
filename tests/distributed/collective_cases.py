"""Every PyTorch-style collective on every (shape, dtype) case, as one batch per launched job.

``run_cases()`` runs on each rank (under ``run_workers`` or mpiexec) and returns what it got;
``check_rank(got, rank, n)`` compares one rank's results with NumPy references computed from the
seeded inputs of all ranks. Cases alternate between minigrad Tensors and NumPy arrays and between
synchronous and ``async_op=True`` calls, so both paths are covered for every collective.
"""

from __future__ import annotations

import numpy as np

import minigrad as mg
import minigrad.distributed as dist

SHAPES = [(), (1,), (99, 77)]
DTYPES = ["float32", "int32", "uint8"]
CASES = [(s, d) for d in DTYPES for s in SHAPES]
OPS = ["sum", "avg", "product", "min", "max"]
UFUNC = {"sum": np.add, "product": np.multiply, "min": np.minimum, "max": np.maximum}


def value(rank: int, key: int, shape, dtype: str) -> np.ndarray:
    """Seeded input: small integers (quarter-integers for floats), exact under +, *, min, max."""
    rng = np.random.default_rng(10_000 * rank + key)
    lo = 0 if dtype == "uint8" else -4
    x = rng.integers(lo, 5, size=shape)
    if dtype == "float32":
        x = x + rng.integers(0, 4, size=shape) / 4
    return np.asarray(x).astype(dtype)


def reduce_ref(xs: list[np.ndarray], op: str) -> np.ndarray:
    """The reduction in the arrays' dtype, in rank order (integers wrap like the backends')."""
    if op == "avg":
        total = reduce_ref(xs, "sum")
        return total / np.asarray(len(xs), total.dtype) if total.dtype.kind == "f" else (
            total // np.asarray(len(xs), total.dtype))
    out = xs[0].copy()
    for x in xs[1:]:
        out = UFUNC[op](out, x).astype(xs[0].dtype)
    return out


def _chunk_shape(shape) -> tuple:
    return shape if shape else (1,)


def run_cases() -> dict:
    r, n = dist.get_rank(), dist.get_world_size()
    out: dict = {}
    for c, (shape, dtype) in enumerate(CASES):
        as_tensor = c % 2 == 1
        wrap = (lambda a: mg.tensor(a, dtype=a.dtype, device="cpu0")) if as_tensor else np.asarray
        get = (lambda t: t.numpy()) if as_tensor else (lambda a: a)
        asyn = c % 3 == 2
        x = value(r, c, shape, dtype)

        def done(work, asyn=asyn):
            if asyn:
                assert isinstance(work, dist.Work), work
                work.wait()
            else:
                assert work is None

        for op in OPS:
            t = wrap(x.copy())
            done(dist.all_reduce(t, op=getattr(dist.ReduceOp, op.upper()), async_op=asyn))
            out["all_reduce", c, op] = get(t)
        t = wrap(x.copy() if r == n - 1 else np.zeros(shape, dtype))
        done(dist.broadcast(t, src=n - 1, async_op=asyn))
        out["broadcast", c] = get(t)
        t = wrap(x.copy())
        done(dist.reduce(t, dst=0, op=dist.ReduceOp.MAX, async_op=asyn))
        out["reduce", c] = get(t)
        ts = [wrap(np.zeros(shape, dtype)) for _ in range(n)]
        done(dist.all_gather(ts, wrap(x), async_op=asyn))
        out["all_gather", c] = [get(t) for t in ts]
        big = wrap(np.zeros((n, *shape), dtype))
        done(dist.all_gather_into_tensor(big, wrap(x), async_op=asyn))
        out["all_gather_into_tensor/stack", c] = get(big)
        if shape:
            big = wrap(np.zeros((n * shape[0], *shape[1:]), dtype))
            done(dist.all_gather_into_tensor(big, wrap(x), async_op=asyn))
            out["all_gather_into_tensor/concat", c] = get(big)
        chunks = [value(r, 100 * c + j, shape, dtype) for j in range(n)]
        t = wrap(np.zeros(shape, dtype))
        done(dist.reduce_scatter(t, [wrap(ch) for ch in chunks], op="sum", async_op=asyn))
        out["reduce_scatter", c] = get(t)
        t = wrap(np.zeros(shape, dtype))
        done(dist.reduce_scatter_tensor(t, wrap(np.stack(chunks)), op="min", async_op=asyn))
        out["reduce_scatter_tensor/stack", c] = get(t)
        if shape:
            t = wrap(np.zeros(shape, dtype))
            whole = wrap(np.concatenate(chunks))
            done(dist.reduce_scatter_tensor(t, whole, op="sum", async_op=asyn))
            out["reduce_scatter_tensor/concat", c] = get(t)
        dst = 1 % n
        ts = [wrap(np.zeros(shape, dtype)) for _ in range(n)] if r == dst else None
        done(dist.gather(wrap(x), ts, dst=dst, async_op=asyn))
        out["gather", c] = None if ts is None else [get(t) for t in ts]
        t = wrap(np.zeros(shape, dtype))
        done(dist.scatter(t, [wrap(ch) for ch in chunks] if r == 0 else None, src=0,
                          async_op=asyn))
        out["scatter", c] = get(t)
        ts = [wrap(np.zeros(shape, dtype)) for _ in range(n)]
        done(dist.all_to_all(ts, [wrap(ch) for ch in chunks], async_op=asyn))
        out["all_to_all", c] = [get(t) for t in ts]
        cs = _chunk_shape(shape)
        flat_in = wrap(np.concatenate([ch.reshape(cs) for ch in chunks]))
        t = wrap(np.zeros((n * cs[0], *cs[1:]), dtype))
        done(dist.all_to_all_single(t, flat_in, async_op=asyn))
        out["all_to_all_single", c] = get(t)
        # uneven splits: rank r sends j + 1 rows to rank j, so it receives r + 1 rows from each
        rows = value(r, 7000 + c, (sum(range(1, n + 1)), 3), dtype)
        t = wrap(np.zeros((n * (r + 1), 3), dtype))
        done(dist.all_to_all_single(t, wrap(rows), [r + 1] * n, list(range(1, n + 1)),
                                    async_op=asyn))
        out["all_to_all_single/uneven", c] = get(t)
        # ring of messages: isend to the right, irecv from the left; then a blocking pair
        t = wrap(np.zeros(shape, dtype))
        works = [dist.isend(wrap(x), (r + 1) % n), dist.irecv(t, (r - 1) % n)]
        for w in works:
            w.wait()
        out["ring", c] = get(t)
        if n > 1 and r < 2:
            t = wrap(np.zeros(shape, dtype))
            if r == 0:
                dist.send(wrap(x), 1)
                assert dist.recv(t, 1) == 1
            else:
                assert dist.recv(t, 0) == 0
                dist.send(wrap(x), 0)
            out["pair", c] = get(t)
    dist.barrier(async_op=True).wait()
    return out


def check_rank(got: dict, r: int, n: int) -> int:
    """Assert one rank's results; returns the number of arrays compared."""
    count = 0

    def same(actual, expected, what):
        nonlocal count
        count += 1
        assert actual.dtype == expected.dtype, (what, actual.dtype, expected.dtype)
        assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
        np.testing.assert_array_equal(actual, expected, err_msg=str(what))

    for c, (shape, dtype) in enumerate(CASES):
        xs = [value(j, c, shape, dtype) for j in range(n)]
        chunks = [[value(j, 100 * c + i, shape, dtype) for i in range(n)] for j in range(n)]
        for op in OPS:
            same(got["all_reduce", c, op], reduce_ref(xs, op), ("all_reduce", c, op))
        same(got["broadcast", c], xs[n - 1], ("broadcast", c))
        same(got["reduce", c], reduce_ref(xs, "max") if r == 0 else xs[r], ("reduce", c))
        for j in range(n):
            same(got["all_gather", c][j], xs[j], ("all_gather", c, j))
            same(got["all_to_all", c][j], chunks[j][r], ("all_to_all", c, j))
        same(got["all_gather_into_tensor/stack", c], np.stack(xs), ("agit/stack", c))
        if shape:
            same(got["all_gather_into_tensor/concat", c], np.concatenate(xs), ("agit/concat", c))
            expect = reduce_ref([ch[r] for ch in chunks], "sum")
            same(got["reduce_scatter_tensor/concat", c], expect, ("rst/concat", c))
        same(got["reduce_scatter", c], reduce_ref([ch[r] for ch in chunks], "sum"), ("rs", c))
        same(got["reduce_scatter_tensor/stack", c], reduce_ref([ch[r] for ch in chunks], "min"),
             ("rst/stack", c))
        if r == 1 % n:
            for j in range(n):
                same(got["gather", c][j], xs[j], ("gather", c, j))
        else:
            assert got["gather", c] is None
        same(got["scatter", c], chunks[0][r], ("scatter", c))
        cs = _chunk_shape(shape)
        expect = np.concatenate([chunks[j][r].reshape(cs) for j in range(n)])
        same(got["all_to_all_single", c], expect, ("all_to_all_single", c))
        pieces = []
        for j in range(n):
            rows = value(j, 7000 + c, (sum(range(1, n + 1)), 3), dtype)
            start = sum(range(1, r + 1))
            pieces.append(rows[start : start + r + 1])
        same(got["all_to_all_single/uneven", c], np.concatenate(pieces), ("a2a_single/uneven", c))
        same(got["ring", c], xs[(r - 1) % n], ("ring", c))
        if n > 1 and r < 2:
            same(got["pair", c], xs[1 - r], ("pair", c))
    return count

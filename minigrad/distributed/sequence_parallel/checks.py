"""Argument checks shared by the sequence-parallel attention modules (before any communication,
so that every rank raises the same error instead of leaving its peers waiting)."""

from __future__ import annotations

from minigrad.autodiff.tensor import Tensor

__all__ = ["check_qkv", "check_zigzag_shard"]


def check_qkv(op: str, q, k, v) -> None:
    """``q``, ``k``: ``(batch, heads, tokens, head_dim)``; ``v``: ``(batch, heads, tokens, v_dim)``;
    all Tensors of one floating dtype."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(
                f"{op}: {name} must be (batch, heads, tokens, head_dim), got shape {t.shape}"
            )
        if t.dtype.kind != "f":
            raise TypeError(f"{op}: {name} must have a floating dtype, got {t.dtype.name}")
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"{op}: q {q.shape}, k {k.shape} and v {v.shape} must agree (k like q; v like q "
            f"except its last axis)"
        )
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(
            f"{op}: q, k, v must share one dtype, got {q.dtype.name}, {k.dtype.name}, "
            f"{v.dtype.name}"
        )


def check_zigzag_shard(op: str, shard_len: int) -> None:
    """A zigzag shard holds two chunks of ``L/(2N)`` tokens, so its length must be even."""
    if shard_len % 2:
        raise ValueError(
            f"{op}(zigzag=True): a zigzag shard holds two chunks of L/(2N) tokens, so its length "
            f"must be even; got {shard_len} tokens on this rank"
        )

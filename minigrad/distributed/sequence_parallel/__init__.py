"""Sequence parallelism: long sequences split across the ranks of a sequence group.

Each of N ranks holds L/N tokens of every sequence (contiguous or zigzag layout). Token-wise layers
run locally; attention, the one layer that mixes tokens, runs as

* :class:`RingAttention` — K/V blocks travel around a ring, folded in with an online softmax, the
  exact backward replays the ring; one (L/N)² score block per head and rank; transfers overlap
  compute; causal work balanced by zigzag shards (:mod:`.ring_attention`, :mod:`.transfer`);
* :class:`UlyssesAttention` — all-to-all from a token split to a head split and back, local
  attention in between (:mod:`.ulysses`).

Helpers split and gather sequences (:mod:`.sharding`), give the loss as each rank's share of the
global mean (:mod:`.loss`), and :class:`SequenceParallelLM` is a small LM switching between the
two with one argument (:mod:`.transformer`). Parameter gradients are summed over the sequence ×
data group; :mod:`.groups` says which groups are used when none is given.

Example::

    from minigrad.distributed import sequence_parallel as sp

    q, k, v = (sp.split_sequence(t, axis=2, zigzag=True) for t in (q_full, k_full, v_full))
    out = sp.RingAttention(causal=True, zigzag=True)(q, k, v)     # this rank's (B, H, L/N, D)
    full = sp.gather_sequence(out, axis=2, zigzag=True)            # (B, H, L, D) on every rank
"""

from minigrad.distributed.sequence_parallel.groups import gradient_group, sequence_group
from minigrad.distributed.sequence_parallel.loss import sequence_cross_entropy
from minigrad.distributed.sequence_parallel.ring_attention import (
    BlockPlan,
    RingAttention,
    ScoreBlock,
    record_score_blocks,
    ring_attention,
    ring_block_plan,
)
from minigrad.distributed.sequence_parallel.sharding import (
    gather_sequence,
    sequence_positions,
    shard_ranges,
    split_lm_batch,
    split_sequence,
)
from minigrad.distributed.sequence_parallel.transfer import RingExchange
from minigrad.distributed.sequence_parallel.transformer import (
    DenseAttention,
    SequenceParallelLayers,
    SequenceParallelLM,
)
from minigrad.distributed.sequence_parallel.ulysses import UlyssesAttention, ulysses_attention

__all__ = [
    "BlockPlan",
    "DenseAttention",
    "RingAttention",
    "RingExchange",
    "ScoreBlock",
    "SequenceParallelLM",
    "SequenceParallelLayers",
    "UlyssesAttention",
    "gather_sequence",
    "gradient_group",
    "record_score_blocks",
    "ring_attention",
    "ring_block_plan",
    "sequence_cross_entropy",
    "sequence_group",
    "sequence_positions",
    "shard_ranges",
    "split_lm_batch",
    "split_sequence",
    "ulysses_attention",
]

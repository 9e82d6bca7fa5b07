"""flash4.distributed: context parallelism. One attention over a sequence sharded across the ranks of a
torch.distributed group (ring attention: K/V shards travel around the ring while each rank computes on the one it
holds), forward and backward, with the sharding helpers for the load-balanced "zigzag" layout.

    import flash4.distributed as f4d
    q, k, v = (f4d.shard_sequence(t, group) for t in (q_full, k_full, v_full))   # or shard as you load
    out = f4d.ring_flash_attn_func(q, k, v, group, causal=True)                 # this rank's rows
    full = f4d.unshard_sequence(out, group)                                       # for inspection

Packed batches (documents of different lengths in one token stream, as flash4.flash_attn_varlen_func takes
them): ring_flash_attn_varlen_func with shard_varlen / unshard_varlen / varlen_positions, every document cut
per rank.

See docs/context_parallel.md.
"""

from ._api import ring_flash_attn_func
from ._layout import (
    LAYOUTS,
    sequence_positions,
    sequence_positions_for_rank,
    shard_sequence,
    shard_sequence_for_rank,
    unshard_from_shards,
    unshard_sequence,
)
from ._varlen_api import ring_flash_attn_varlen_func
from ._varlen_layout import (
    shard_varlen,
    shard_varlen_for_rank,
    unshard_varlen,
    unshard_varlen_from_shards,
    varlen_cu_seqlens_for_rank,
    varlen_positions,
    varlen_positions_for_rank,
    varlen_token_indices_for_rank,
)

__all__ = [
    "LAYOUTS",
    "ring_flash_attn_func",
    "ring_flash_attn_varlen_func",
    "sequence_positions",
    "sequence_positions_for_rank",
    "shard_sequence",
    "shard_sequence_for_rank",
    "shard_varlen",
    "shard_varlen_for_rank",
    "unshard_from_shards",
    "unshard_sequence",
    "unshard_varlen",
    "unshard_varlen_from_shards",
    "varlen_cu_seqlens_for_rank",
    "varlen_positions",
    "varlen_positions_for_rank",
    "varlen_token_indices_for_rank",
]

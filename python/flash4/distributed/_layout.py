"""Which tokens of the global sequence each rank holds, and the helpers that shard and unshard a batch.

Two layouts of a sequence of N tokens over a ring of W ranks:

- "contiguous": rank r holds tokens [r * N/W, (r + 1) * N/W). Under a causal mask rank r attends to r + 1
  of the W key blocks, so the last rank does about twice the average work.
- "zigzag": the sequence is cut into 2W chunks of N/(2W) tokens; rank r holds chunks r and 2W - 1 - r (in
  that order). Every rank then holds one early and one late chunk, and under a causal mask every rank does
  the same work at every step of the ring.

A rank's shard is a list of segments (global start, length) in the order they are stored along the sequence
dimension; the attention masks are derived from these global positions.
"""

from typing import List, NamedTuple

import torch

LAYOUTS = ("contiguous", "zigzag")


class Segment(NamedTuple):
    """Tokens [start, start + length) of the global sequence, stored at [local_start, local_start + length)
    of a rank's shard."""

    start: int
    length: int
    local_start: int


def check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def chunks_per_rank(layout):
    return 2 if layout == "zigzag" else 1


def segments(layout, rank, world_size, local_seqlen):
    """The segments of rank `rank`'s shard of local_seqlen tokens (the global sequence has world_size *
    local_seqlen tokens)."""
    check_layout(layout)
    if layout == "contiguous":
        return [Segment(rank * local_seqlen, local_seqlen, 0)]
    if local_seqlen % 2 != 0:
        raise ValueError(
            f"layout 'zigzag' needs an even local sequence length (two chunks per rank), got {local_seqlen}; "
            "the global sequence length must be a multiple of 2 * world_size"
        )
    chunk = local_seqlen // 2
    return [Segment(rank * chunk, chunk, 0), Segment((2 * world_size - 1 - rank) * chunk, chunk, chunk)]


def _check_divisible(seqlen, world_size, layout, name):
    parts = world_size * chunks_per_rank(layout)
    if seqlen % parts != 0:
        raise ValueError(
            f"{name} = {seqlen} is not divisible by {parts} (world_size {world_size} x {chunks_per_rank(layout)} "
            f"chunk(s) per rank for layout {layout!r}); pad the sequence to a multiple of {parts}"
        )


def _group_rank_and_size(group):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "flash4.distributed needs an initialized torch.distributed process group (torch.distributed."
            "init_process_group) or an explicit group"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def sequence_positions(global_seqlen, group=None, layout="zigzag", device=None):
    """Global token positions (int64, length global_seqlen / world_size) of this rank's shard, in stored
    order: what rotary embeddings (or any position-dependent input) of the shard must use."""
    check_layout(layout)
    rank, world_size = _group_rank_and_size(group)
    return sequence_positions_for_rank(global_seqlen, rank, world_size, layout, device)


def sequence_positions_for_rank(global_seqlen, rank, world_size, layout="zigzag", device=None):
    """sequence_positions for an explicit rank and world size (no process group needed)."""
    _check_divisible(global_seqlen, world_size, layout, "global_seqlen")
    local = global_seqlen // world_size
    return torch.cat([torch.arange(s.start, s.start + s.length, device=device)
                      for s in segments(layout, rank, world_size, local)])


def shard_sequence(x, group=None, layout="zigzag", dim=1):
    """This rank's shard of the full tensor x (a view-free copy), cut along dimension `dim` (the sequence
    dimension: 1 in flash4's (batch, seqlen, heads, head_dim) layout). Every rank passes the same x."""
    check_layout(layout)
    rank, world_size = _group_rank_and_size(group)
    return shard_sequence_for_rank(x, rank, world_size, layout, dim)


def shard_sequence_for_rank(x, rank, world_size, layout="zigzag", dim=1):
    """shard_sequence for an explicit rank and world size (no process group needed)."""
    seqlen = x.shape[dim]
    _check_divisible(seqlen, world_size, layout, f"x.shape[{dim}] (the sequence length)")
    local = seqlen // world_size
    parts = [x.narrow(dim, s.start, s.length) for s in segments(layout, rank, world_size, local)]
    return torch.cat(parts, dim=dim).contiguous()


def unshard_sequence(x_local, group=None, layout="zigzag", dim=1):
    """The full tensor from every rank's shard (an all_gather on the group; every rank gets the result).
    Not differentiable: gather gradients or outputs for inspection, loss and metrics."""
    import torch.distributed as dist

    check_layout(layout)
    rank, world_size = _group_rank_and_size(group)
    x_local = x_local.contiguous()
    gathered = [torch.empty_like(x_local) for _ in range(world_size)]
    dist.all_gather(gathered, x_local, group=group)
    return unshard_from_shards(gathered, layout, dim)


def unshard_from_shards(shards: List[torch.Tensor], layout="zigzag", dim=1):
    """The full tensor from the list of every rank's shard, in rank order (no process group needed)."""
    check_layout(layout)
    world_size = len(shards)
    local = shards[0].shape[dim]
    pieces = []
    for rank, shard in enumerate(shards):
        for s in segments(layout, rank, world_size, local):
            pieces.append((s.start, shard.narrow(dim, s.local_start, s.length)))
    pieces.sort(key=lambda p: p[0])
    return torch.cat([p[1] for p in pieces], dim=dim)

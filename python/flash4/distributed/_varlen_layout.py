"""Which tokens of a packed batch (documents of different lengths in one token stream, described by cu_seqlens)
each rank holds, and the helpers that shard and unshard a packed batch.

Every document is cut on its own, like a dense sequence: into 2W chunks under "zigzag" (rank r holds chunks r
and 2W - 1 - r of every document, so under a causal mask every rank's work is the same for any mix of lengths)
or into W chunks under "contiguous" (rank r holds chunk r). A document of length L is cut into chunks of
floor(L / P) or floor(L / P) + 1 tokens (P chunks): the L mod P longer chunks rotate from document to document
over the chunk indices, so that the ranks' token counts differ by at most two for any mix of lengths (no
padding: a document of one token is one chunk, held by one rank; the others hold none of it).

A rank's shard stores, document after document, its chunks of that document in chunk order; the shard is
described by DocSegments (document, position in the document, length, row in the shard).
"""

from typing import List, NamedTuple, Sequence

import torch

from ._layout import chunks_per_rank, check_layout


class DocSegment(NamedTuple):
    """Positions [start, start + length) of document `doc`, stored at rows [local_start, local_start + length)
    of a rank's packed shard."""

    doc: int
    start: int
    length: int
    local_start: int


def read_cu_seqlens(cu_seqlens) -> List[int]:
    """cu_seqlens (a 1-D integer tensor, on any device, or a sequence of ints) as a list of Python ints;
    ValueError/TypeError unless it is a valid offsets array: cu[0] = 0, non-decreasing."""
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
            raise ValueError(f"cu_seqlens must be a 1-D integer tensor (batch + 1,), got {cu_seqlens.dtype} of shape "
                             f"{tuple(cu_seqlens.shape)}")
        values = [int(x) for x in cu_seqlens.tolist()]
    elif isinstance(cu_seqlens, (list, tuple)):
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in cu_seqlens):
            raise TypeError("cu_seqlens must be a 1-D integer tensor or a sequence of ints")
        values = list(cu_seqlens)
    else:
        raise TypeError(f"cu_seqlens must be a 1-D integer tensor or a sequence of ints, got "
                        f"{type(cu_seqlens).__name__}")
    if len(values) == 0 or values[0] != 0:
        raise ValueError(f"cu_seqlens must start with 0 (running offsets of the documents), got {values[:4]}")
    for b in range(len(values) - 1):
        if values[b + 1] < values[b]:
            raise ValueError(f"cu_seqlens must be non-decreasing, but cu_seqlens[{b + 1}] = {values[b + 1]} < "
                             f"cu_seqlens[{b}] = {values[b]}")
    return values


def chunk_bounds(cu: Sequence[int], parts: int) -> List[List[int]]:
    """For every document, the parts + 1 positions where its chunks start and end (see the module doc)."""
    bounds = []
    first_long = 0  # chunk index that gets the next document's first extra token
    for b in range(len(cu) - 1):
        base, extra = divmod(cu[b + 1] - cu[b], parts)
        edges = [0]
        for j in range(parts):
            edges.append(edges[-1] + base + (1 if (j - first_long) % parts < extra else 0))
        first_long = (first_long + extra) % parts
        bounds.append(edges)
    return bounds


def rank_chunks(layout, rank, world_size):
    """The chunk indices of a document that rank `rank` holds, in stored order."""
    return [rank, 2 * world_size - 1 - rank] if layout == "zigzag" else [rank]


class VarlenLayout:
    """The segments of every rank's shard of one packed batch."""

    def __init__(self, cu: Sequence[int], world_size: int, layout: str):
        check_layout(layout)
        self.cu = list(cu)
        self.world_size = world_size
        self.layout = layout
        bounds = chunk_bounds(self.cu, world_size * chunks_per_rank(layout))
        self.segments = []  # per rank: [DocSegment]
        for rank in range(world_size):
            segments, row = [], 0
            for doc, edges in enumerate(bounds):
                for chunk in rank_chunks(layout, rank, world_size):
                    length = edges[chunk + 1] - edges[chunk]
                    if length > 0:
                        segments.append(DocSegment(doc, edges[chunk], length, row))
                        row += length
            self.segments.append(segments)
        self.rows = [sum(s.length for s in segs) for segs in self.segments]  # tokens of each rank's shard

    def token_indices(self, rank, device=None):
        """The rows of the unsharded packed stream that rank `rank`'s shard holds, in stored order (int64)."""
        parts = [torch.arange(self.cu[s.doc] + s.start, self.cu[s.doc] + s.start + s.length)
                 for s in self.segments[rank]]
        indices = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
        return indices.to(device) if device is not None else indices

    def positions(self, rank, device=None):
        """Each of the shard's tokens' position inside its document (rotary restarts at every document)."""
        parts = [torch.arange(s.start, s.start + s.length) for s in self.segments[rank]]
        positions = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
        return positions.to(device) if device is not None else positions

    def local_cu_seqlens(self, rank, device=None):
        """int32 (batch + 1,): the running offsets of every document's tokens in the rank's shard."""
        per_doc = [0] * (len(self.cu) - 1)
        for s in self.segments[rank]:
            per_doc[s.doc] += s.length
        offsets = [0]
        for n in per_doc:
            offsets.append(offsets[-1] + n)
        return torch.tensor(offsets, dtype=torch.int32, device=device)


def _group_rank_and_size(group):
    from ._layout import _group_rank_and_size as rank_and_size

    return rank_and_size(group)


def shard_varlen_for_rank(x, cu_seqlens, rank, world_size, layout="zigzag", dim=0):
    """Rank `rank`'s shard of the packed tensor x (the unsharded token stream along dimension `dim`, 0 in
    flash4's (total, heads, head_dim) layout), cut per document as cu_seqlens describes (no group needed)."""
    layout_ = VarlenLayout(read_cu_seqlens(cu_seqlens), world_size, layout)
    if x.shape[dim] != layout_.cu[-1]:
        raise ValueError(f"x.shape[{dim}] = {x.shape[dim]} but cu_seqlens[-1] = {layout_.cu[-1]} (the packed "
                         "batch's token count)")
    return x.index_select(dim, layout_.token_indices(rank, x.device))


def shard_varlen(x, cu_seqlens, group=None, layout="zigzag", dim=0):
    """This rank's shard of the packed tensor x; every rank passes the same x and cu_seqlens."""
    rank, world_size = _group_rank_and_size(group)
    return shard_varlen_for_rank(x, cu_seqlens, rank, world_size, layout, dim)


def unshard_varlen_from_shards(shards: List[torch.Tensor], cu_seqlens, layout="zigzag", dim=0):
    """The packed tensor from the list of every rank's shard, in rank order (no group needed)."""
    layout_ = VarlenLayout(read_cu_seqlens(cu_seqlens), len(shards), layout)
    for rank, shard in enumerate(shards):
        if shard.shape[dim] != layout_.rows[rank]:
            raise ValueError(f"rank {rank}'s shard has {shard.shape[dim]} tokens along dimension {dim}; its share "
                             f"of cu_seqlens is {layout_.rows[rank]}")
    stacked = torch.cat([s.movedim(dim, 0) for s in shards])
    indices = torch.cat([layout_.token_indices(r, stacked.device) for r in range(len(shards))])
    full = torch.empty_like(stacked)
    full[indices] = stacked
    return full.movedim(0, dim)


def unshard_varlen(x_local, cu_seqlens, group=None, layout="zigzag", dim=0):
    """The packed tensor from every rank's shard (an all_gather on the group, the shards padded to the longest;
    every rank gets the result). Not differentiable: for inspection, losses and metrics."""
    import torch.distributed as dist

    rank, world_size = _group_rank_and_size(group)
    layout_ = VarlenLayout(read_cu_seqlens(cu_seqlens), world_size, layout)
    longest = max(layout_.rows)
    local = x_local.movedim(dim, 0)
    padded = local.new_zeros((longest,) + tuple(local.shape[1:]))
    padded[: local.shape[0]] = local
    gathered = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(gathered, padded, group=group)
    shards = [g[: layout_.rows[r]].movedim(0, dim) for r, g in enumerate(gathered)]
    return unshard_varlen_from_shards(shards, layout_.cu, layout, dim)


def varlen_positions_for_rank(cu_seqlens, rank, world_size, layout="zigzag", device=None):
    """The position inside its document of each token of rank `rank`'s shard (int64, in stored order): what
    rotary embeddings of the shard must use (no group needed)."""
    return VarlenLayout(read_cu_seqlens(cu_seqlens), world_size, layout).positions(rank, device)


def varlen_positions(cu_seqlens, group=None, layout="zigzag", device=None):
    """varlen_positions_for_rank for this rank of `group`."""
    rank, world_size = _group_rank_and_size(group)
    return varlen_positions_for_rank(cu_seqlens, rank, world_size, layout, device)


def varlen_token_indices_for_rank(cu_seqlens, rank, world_size, layout="zigzag", device=None):
    """The rows of the unsharded packed stream held by rank `rank`'s shard, in stored order (int64): shard any
    per-token tensor (labels, loss masks) with x.index_select(0, indices)."""
    return VarlenLayout(read_cu_seqlens(cu_seqlens), world_size, layout).token_indices(rank, device)


def varlen_cu_seqlens_for_rank(cu_seqlens, rank, world_size, layout="zigzag", device=None):
    """int32 running offsets of every document's tokens inside rank `rank`'s shard (documents the rank holds
    nothing of have length 0 there)."""
    return VarlenLayout(read_cu_seqlens(cu_seqlens), world_size, layout).local_cu_seqlens(rank, device)

"""Which packed flash4 calls compute a rank's query shard of a packed batch against one K/V shard of the ring.

Each (query segment, key segment) pair of one document is planned like a dense block (_block_plan.
plan_segment_pair: trimmed to its visible rows and keys, so that one bottom-right aligned window expresses its
mask exactly). flash4's window is one per call, so the blocks are grouped by window; the blocks of one group
become the sequences of one packed call (cu_seqlens_q/k of the blocks' row and key counts), whose queries and
keys are gathered from the shards (index_select) unless they are the whole shard in order. A call holds at most
one block of each document: blocks of one document may share rows or keys, and a call's partial output must
give each row at most once (it is merged row by row) and its dK/dV each key at most once.
"""

from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from ._block_plan import UNBOUNDED, BlockCall, _merge_unmasked, plan_segment_pair
from ._varlen_layout import DocSegment


class VarlenCall(NamedTuple):
    """One packed flash4 call. q_rows / k_rows: int64 row indices into the query / key shard (None = the
    whole shard in order); cu_seqlens_q / k: int32 offsets of the call's sequences (its blocks)."""

    window_left: int
    window_right: int
    q_rows: Optional[torch.Tensor]
    k_rows: Optional[torch.Tensor]
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int


def _document_blocks(q_segments: List[DocSegment], k_segments: List[DocSegment], band) -> List[BlockCall]:
    band_lo, band_hi = band
    blocks = []
    for qs in q_segments:
        for ks in k_segments:
            d = ks.start - qs.start
            lo = band_lo - d if band_lo > -UNBOUNDED else -UNBOUNDED
            hi = band_hi - d if band_hi < UNBOUNDED else UNBOUNDED
            plan = plan_segment_pair(qs.length, ks.length, lo, hi)
            if plan is not None:
                c, e, a, b, wl, wr = plan
                blocks.append(BlockCall(qs.local_start + c, qs.local_start + e, ks.local_start + a,
                                        ks.local_start + b, wl, wr))
    # A document has at most 2 x 2 blocks: merging its adjacent unmasked ones is cheap.
    return _merge_unmasked(blocks)


def _rows(ranges: List[Tuple[int, int]], total: int, device) -> Optional[torch.Tensor]:
    """Row indices of the concatenated ranges, or None when they are exactly rows 0 .. total - 1 in order."""
    if ranges and ranges[0][0] == 0 and ranges[-1][1] == total and all(
            ranges[n][1] == ranges[n + 1][0] for n in range(len(ranges) - 1)):
        return None
    return torch.cat([torch.arange(lo, hi) for lo, hi in ranges]).to(device)


def _offsets(lengths: List[int], device) -> torch.Tensor:
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32).to(device)


def plan_varlen_step(q_segments: List[DocSegment], k_segments: List[DocSegment], band, q_total: int, k_total: int,
                     device) -> List[VarlenCall]:
    """The packed calls of a query shard (q_total rows) against a key shard (k_total rows)."""
    k_by_doc: Dict[int, List[DocSegment]] = {}
    for ks in k_segments:
        k_by_doc.setdefault(ks.doc, []).append(ks)
    q_by_doc: Dict[int, List[DocSegment]] = {}
    for qs in q_segments:
        q_by_doc.setdefault(qs.doc, []).append(qs)
    # (window, n-th block of its document with that window) -> blocks, documents in stored order.
    groups: Dict[Tuple[int, int, int], List[BlockCall]] = {}
    for doc, segments in q_by_doc.items():
        seen: Dict[Tuple[int, int], int] = {}
        for block in _document_blocks(segments, k_by_doc.get(doc, []), band):
            window = (block.window_left, block.window_right)
            layer = seen.get(window, 0)
            seen[window] = layer + 1
            groups.setdefault(window + (layer,), []).append(block)
    calls = []
    for (window_left, window_right, _), blocks in sorted(groups.items()):
        q_ranges = [(b.q_lo, b.q_hi) for b in blocks]
        k_ranges = [(b.k_lo, b.k_hi) for b in blocks]
        q_lengths = [hi - lo for lo, hi in q_ranges]
        k_lengths = [hi - lo for lo, hi in k_ranges]
        calls.append(VarlenCall(window_left, window_right, _rows(q_ranges, q_total, device),
                                _rows(k_ranges, k_total, device), _offsets(q_lengths, device),
                                _offsets(k_lengths, device), max(q_lengths), max(k_lengths)))
    return calls

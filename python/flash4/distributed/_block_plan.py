"""Which flash4 calls compute the attention of a rank's query shard against one K/V shard of the ring.

The global mask (self-attention over one sequence, so bottom-right and top-left alignment coincide) is a band
of allowed offsets key - query: [-window_left, window_right], with causal folding window_right to min(., 0)
and -1 meaning unbounded. A query segment starting at global position qs against a key segment starting at
ks sees the same band shifted by d = ks - qs in its local coordinates.

One flash4 call on queries [c, e) and keys [a, b) of a segment pair can express the local band [lo, hi]
exactly when the call's bottom-right diagonal lies in the band: its mask is
window_left = (b - e) - lo, window_right = hi - (b - e), both of which must be >= 0 (or the side unbounded).
Trimming a block to the rows that see some key and the keys that some row sees always achieves this (the
trimmed block ends where the band's lower or upper edge, or the block's own corner, ends), so no block ever
needs a mask the library cannot express: rows and keys outside the trimmed block see nothing of this block.
Rows that see nothing get no partial result (the LSE merge treats them as lse = -inf).
"""

from typing import List, NamedTuple, Optional

from ._layout import Segment

UNBOUNDED = 1 << 62  # larger than any offset between two token positions


class BlockCall(NamedTuple):
    """One flash4 call: queries [q_lo, q_hi) and keys [k_lo, k_hi) of the local shards (storage coordinates)
    with the library's window (-1 = unbounded; causal is never used: a causal block is window_right = 0)."""

    q_lo: int
    q_hi: int
    k_lo: int
    k_hi: int
    window_left: int
    window_right: int

    @property
    def unmasked(self):
        return self.window_left == -1 and self.window_right == -1


def global_band(causal, window_left, window_right):
    """(lo, hi): the allowed global offsets key - query, +-UNBOUNDED for an unbounded side."""
    if causal:
        window_right = 0 if window_right < 0 else min(window_right, 0)
    lo = -window_left if window_left >= 0 else -UNBOUNDED
    hi = window_right if window_right >= 0 else UNBOUNDED
    return lo, hi


def plan_segment_pair(q_len, k_len, band_lo, band_hi):
    """(c, e, a, b, window_left, window_right) of the one call covering every visible (query, key) pair of a
    q_len x k_len block whose allowed offsets key - query are [band_lo, band_hi]; None when nothing is
    visible."""
    c = max(0, -band_hi)  # first row that sees a key: i + band_hi >= 0
    e = min(q_len, k_len - band_lo)  # past the last row: i + band_lo <= k_len - 1
    a = max(0, band_lo)  # first key some row sees
    b = min(k_len, q_len + band_hi)  # past the last key: j <= q_len - 1 + band_hi
    if c >= e or a >= b or band_lo > band_hi:
        return None
    corner = b - e  # offset of the trimmed block's bottom-right diagonal, in the band (see the module doc)
    # A side of the band that cuts no pair of the trimmed block needs no mask.
    cuts_low = band_lo > a - (e - 1)
    cuts_high = band_hi < (b - 1) - c
    window_left = corner - band_lo if cuts_low else -1
    window_right = band_hi - corner if cuts_high else -1
    assert window_left >= -1 and window_right >= -1, "trimmed block has its diagonal outside the band"
    return c, e, a, b, window_left, window_right


def plan_shard_pair(q_segments: List[Segment], k_segments: List[Segment], band) -> List[BlockCall]:
    """The calls that compute a query shard against a key shard: one per visible segment pair, then unmasked
    calls that are adjacent in both shards merged into one (whole non-causal blocks become a single call)."""
    band_lo, band_hi = band
    calls = []
    for qs in q_segments:
        for ks in k_segments:
            d = ks.start - qs.start
            lo = band_lo - d if band_lo > -UNBOUNDED else -UNBOUNDED
            hi = band_hi - d if band_hi < UNBOUNDED else UNBOUNDED
            plan = plan_segment_pair(qs.length, ks.length, lo, hi)
            if plan is None:
                continue
            c, e, a, b, wl, wr = plan
            calls.append(BlockCall(qs.local_start + c, qs.local_start + e, ks.local_start + a, ks.local_start + b,
                                   wl, wr))
    return _merge_unmasked(calls)


def _merge_unmasked(calls: List[BlockCall]) -> List[BlockCall]:
    merged = True
    while merged:
        merged = False
        for x in range(len(calls)):
            for y in range(len(calls)):
                joined = _join(calls[x], calls[y]) if x != y else None
                if joined is not None:
                    calls = [c for n, c in enumerate(calls) if n not in (x, y)] + [joined]
                    merged = True
                    break
            if merged:
                break
    return sorted(calls)


def _join(p: BlockCall, q: BlockCall) -> Optional[BlockCall]:
    """p and q as one unmasked call when both are unmasked and q continues p along one shard."""
    if not (p.unmasked and q.unmasked):
        return None
    if (p.k_lo, p.k_hi) == (q.k_lo, q.k_hi) and p.q_hi == q.q_lo:
        return BlockCall(p.q_lo, q.q_hi, p.k_lo, p.k_hi, -1, -1)
    if (p.q_lo, p.q_hi) == (q.q_lo, q.q_hi) and p.k_hi == q.k_lo:
        return BlockCall(p.q_lo, p.q_hi, p.k_lo, q.k_hi, -1, -1)
    return None

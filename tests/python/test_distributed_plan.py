"""flash4.distributed without a process group: the block plans cover exactly the mask of the unsharded
attention (every visible pair once, no hidden pair), the layouts' shard/unshard round trip and positions, and
the LSE merge against a direct softmax."""

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from attention_reference import allowed_keys  # noqa: E402
from flash4._lse_merge import empty_attention_accumulator, merge_attention_partials  # noqa: E402
from flash4.distributed import (  # noqa: E402
    sequence_positions_for_rank,
    shard_sequence_for_rank,
    unshard_from_shards,
)
from flash4.distributed._block_plan import global_band, plan_shard_pair  # noqa: E402
from flash4.distributed._layout import segments  # noqa: E402

MASKS = [(False, (-1, -1)), (True, (-1, -1)), (False, (5, 3)), (True, (7, -1)), (True, (0, -1)), (False, (0, 0)),
         (False, (-1, 2)), (False, (9, -1)), (True, (3, 4)), (False, (40, 40))]


def _call_mask(q_len, k_len, window_left, window_right):
    """The library's bottom-right aligned mask of one call (causal never used by the plans)."""
    return allowed_keys(q_len, k_len, False, (window_left, window_right))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("local_seqlen", [6, 8])
@pytest.mark.parametrize("causal,window", MASKS)
def test_plans_cover_the_global_mask_exactly(world_size, layout, local_seqlen, causal, window):
    n = world_size * local_seqlen
    expected = allowed_keys(n, n, causal, window)
    band = global_band(causal, *window)
    covered = np.zeros((n, n), dtype=np.int64)
    for q_rank, k_rank in itertools.product(range(world_size), repeat=2):
        q_segments = segments(layout, q_rank, world_size, local_seqlen)
        k_segments = segments(layout, k_rank, world_size, local_seqlen)
        q_pos = np.concatenate([np.arange(s.start, s.start + s.length) for s in q_segments])
        k_pos = np.concatenate([np.arange(s.start, s.start + s.length) for s in k_segments])
        for call in plan_shard_pair(q_segments, k_segments, band):
            assert call.window_left >= -1 and call.window_right >= -1
            visible = _call_mask(call.q_hi - call.q_lo, call.k_hi - call.k_lo, call.window_left, call.window_right)
            rows, cols = np.nonzero(visible)
            np.add.at(covered, (q_pos[call.q_lo + rows], k_pos[call.k_lo + cols]), 1)
            # Trimmed: every row of a call sees some key (none gets a fully masked partial result).
            assert visible.any(axis=1).all()
    np.testing.assert_array_equal(covered, expected.astype(np.int64))


def test_zigzag_causal_plan_is_balanced_and_merged():
    """Under a causal mask every rank computes the same number of visible pairs at every step, and the
    unmasked blocks of a step are one call."""
    world_size, local_seqlen = 4, 8
    band = global_band(True, -1, -1)
    for step in range(world_size):
        work = []
        for rank in range(world_size):
            source = (rank - step) % world_size
            calls = plan_shard_pair(segments("zigzag", rank, world_size, local_seqlen),
                                    segments("zigzag", source, world_size, local_seqlen), band)
            pairs = sum(_call_mask(c.q_hi - c.q_lo, c.k_hi - c.k_lo, c.window_left, c.window_right).sum()
                        for c in calls)
            work.append(pairs)
            if step > 0:
                assert len(calls) == 1 and calls[0].window_left == calls[0].window_right == -1, calls
        assert len(set(work)) == 1, f"step {step}: visible pairs per rank {work}"


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_shard_unshard_round_trip_and_positions(layout, world_size):
    seqlen = 12 * world_size
    x = torch.arange(2 * seqlen * 3, dtype=torch.float32).reshape(2, seqlen, 3)
    shards = [shard_sequence_for_rank(x, r, world_size, layout, dim=1) for r in range(world_size)]
    torch.testing.assert_close(unshard_from_shards(shards, layout, dim=1), x, rtol=0, atol=0)
    for r, shard in enumerate(shards):
        pos = sequence_positions_for_rank(seqlen, r, world_size, layout)
        torch.testing.assert_close(shard, x[:, pos], rtol=0, atol=0)
    all_positions = torch.cat([sequence_positions_for_rank(seqlen, r, world_size, layout)
                               for r in range(world_size)])
    assert sorted(all_positions.tolist()) == list(range(seqlen))


def test_shard_refuses_an_indivisible_sequence():
    x = torch.zeros(1, 10, 2, 8)
    with pytest.raises(ValueError, match=r"not divisible by 6 .*world_size 3 x 2 chunk"):
        shard_sequence_for_rank(x, 0, 3, "zigzag")
    with pytest.raises(ValueError, match="layout must be one of"):
        shard_sequence_for_rank(x, 0, 2, "striped")


def test_lse_merge_equals_the_softmax_over_all_keys():
    torch.manual_seed(0)
    batch, rows, heads, dim, keys = 2, 5, 3, 4, 12
    scores = torch.randn(batch, heads, rows, keys, dtype=torch.float64) * 3
    scores[:, :, 0, :] = float("-inf")  # a row that sees nothing in any part
    scores[:, :, 1, :7] = float("-inf")  # a row that sees nothing in the first two parts
    values = torch.randn(batch, keys, heads, dim, dtype=torch.float64)

    def attend(s, val):
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
        return torch.einsum("bhqk,bkhd->bqhd", p, val), lse

    out_ref, lse_ref = attend(scores, values)
    out_acc, lse_acc = empty_attention_accumulator(batch, rows, heads, dim, "cpu")
    out_acc, lse_acc = out_acc.double(), lse_acc.double()
    for lo, hi in ((0, 3), (3, 7), (7, 12)):
        out_part, lse_part = attend(scores[..., lo:hi], values[:, lo:hi])
        merge_attention_partials(out_acc, lse_acc, out_part, lse_part)
    torch.testing.assert_close(out_acc, out_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse_acc, lse_ref, rtol=1e-12, atol=1e-12)
    assert torch.isneginf(lse_acc[:, :, 0]).all() and (out_acc[:, 0] == 0).all()

"""flash4.distributed's packed (varlen) form without a process group: the packed calls of every pair of shards
cover exactly the per-document mask of the unsharded batch (every visible pair once, no pair across documents),
each call names a row and a key at most once, the per-document sharding round trip, positions, local
cu_seqlens and its balance."""

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from attention_reference import allowed_keys  # noqa: E402
from flash4.distributed import (  # noqa: E402
    shard_varlen_for_rank,
    unshard_varlen_from_shards,
    varlen_cu_seqlens_for_rank,
    varlen_positions_for_rank,
    varlen_token_indices_for_rank,
)
from flash4.distributed._block_plan import global_band  # noqa: E402
from flash4.distributed._varlen_layout import VarlenLayout, read_cu_seqlens  # noqa: E402
from flash4.distributed._varlen_plan import plan_varlen_step  # noqa: E402

MASKS = [(False, (-1, -1)), (True, (-1, -1)), (False, (5, 3)), (True, (4, -1)), (True, (0, -1)), (False, (0, 0)),
         (False, (-1, 2)), (True, (3, 4)), (False, (30, 30))]
LENGTHS = [[13, 1, 6, 22, 3], [1], [0, 8, 0, 1, 2], [16, 16]]


def _offsets(lengths):
    return [0] + list(np.cumsum(lengths, dtype=np.int64).tolist())


def _document_mask(lengths, causal, window):
    """The unsharded packed batch's mask: each document's own (bottom-right = top-left: self-attention)."""
    n = sum(lengths)
    mask = np.zeros((n, n), dtype=bool)
    start = 0
    for length in lengths:
        mask[start:start + length, start:start + length] = allowed_keys(length, length, causal, window)
        start += length
    return mask


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("lengths", LENGTHS[::2], ids=["mixed", "empty-docs"])
@pytest.mark.parametrize("causal,window", MASKS)
def test_packed_calls_cover_the_document_mask_exactly(world_size, layout, lengths, causal, window):
    layout_ = VarlenLayout(_offsets(lengths), world_size, layout)
    expected = _document_mask(lengths, causal, window)
    band = global_band(causal, *window)
    covered = np.zeros(expected.shape, dtype=np.int64)
    for q_rank, k_rank in itertools.product(range(world_size), repeat=2):
        q_index = layout_.token_indices(q_rank).numpy()
        k_index = layout_.token_indices(k_rank).numpy()
        for call in plan_varlen_step(layout_.segments[q_rank], layout_.segments[k_rank], band,
                                     layout_.rows[q_rank], layout_.rows[k_rank], "cpu"):
            rows = np.arange(layout_.rows[q_rank]) if call.q_rows is None else call.q_rows.numpy()
            keys = np.arange(layout_.rows[k_rank]) if call.k_rows is None else call.k_rows.numpy()
            assert len(set(rows.tolist())) == len(rows) and len(set(keys.tolist())) == len(keys)
            cu_q, cu_k = call.cu_seqlens_q.tolist(), call.cu_seqlens_k.tolist()
            assert cu_q[-1] == len(rows) and cu_k[-1] == len(keys) and len(cu_q) == len(cu_k)
            for b in range(len(cu_q) - 1):
                nq, nk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
                assert 0 < nq <= call.max_seqlen_q and 0 < nk <= call.max_seqlen_k
                visible = allowed_keys(nq, nk, False, (call.window_left, call.window_right))
                assert visible.any(axis=1).all(), "a row of a call sees no key"
                r, c = np.nonzero(visible)
                np.add.at(covered, (q_index[rows[cu_q[b] + r]], k_index[keys[cu_k[b] + c]]), 1)
    np.testing.assert_array_equal(covered, expected.astype(np.int64))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("lengths", LENGTHS, ids=["mixed", "one-token", "empty-docs", "even"])
def test_shard_unshard_positions_and_local_offsets(world_size, layout, lengths):
    cu = torch.tensor(_offsets(lengths), dtype=torch.int32)
    n = sum(lengths)
    x = torch.arange(n * 2, dtype=torch.float32).reshape(n, 2)
    positions = torch.cat([torch.arange(length) for length in lengths]).long()
    document = torch.cat([torch.full((length,), d) for d, length in enumerate(lengths)]).long()
    shards = [shard_varlen_for_rank(x, cu, r, world_size, layout) for r in range(world_size)]
    assert torch.equal(unshard_varlen_from_shards(shards, cu, layout), x)
    seen = []
    for rank, shard in enumerate(shards):
        index = varlen_token_indices_for_rank(cu, rank, world_size, layout)
        assert torch.equal(shard, x[index])
        assert torch.equal(varlen_positions_for_rank(cu, rank, world_size, layout), positions[index])
        local_cu = varlen_cu_seqlens_for_rank(cu, rank, world_size, layout)
        assert local_cu.dtype == torch.int32 and local_cu[-1] == shard.shape[0]
        # The shard stores the documents in order: its local offsets count each document's tokens.
        assert torch.equal(local_cu[1:] - local_cu[:-1], torch.bincount(document[index], minlength=len(lengths)))
        seen.append(index)
    assert torch.equal(torch.sort(torch.cat(seen)).values, torch.arange(n))
    # Token counts differ by at most two between ranks (the longer chunks rotate over the chunk indices).
    rows = [s.shape[0] for s in shards]
    assert max(rows) - min(rows) <= 2


def test_zigzag_balances_causal_work_per_document():
    """Under a causal mask every rank computes the same number of visible pairs (within the rounding of the
    chunks) for documents of very different lengths: 2W equal chunks per document."""
    world_size, lengths = 4, [8, 64, 24, 128]
    layout_ = VarlenLayout(_offsets(lengths), world_size, "zigzag")
    band = global_band(True, -1, -1)
    work = []
    for q_rank in range(world_size):
        pairs = 0
        for k_rank in range(world_size):
            for call in plan_varlen_step(layout_.segments[q_rank], layout_.segments[k_rank], band,
                                         layout_.rows[q_rank], layout_.rows[k_rank], "cpu"):
                cu_q, cu_k = call.cu_seqlens_q.tolist(), call.cu_seqlens_k.tolist()
                for b in range(len(cu_q) - 1):
                    pairs += int(allowed_keys(cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b], False,
                                              (call.window_left, call.window_right)).sum())
        work.append(pairs)
    assert len(set(work)) == 1, work


@pytest.mark.parametrize("bad,message", [
    ([1, 3], "must start with 0"),
    ([0, 5, 3], "must be non-decreasing, but cu_seqlens[2] = 3 < cu_seqlens[1] = 5"),
    ([], "must start with 0"),
    ([0.0, 2.0], "sequence of ints"),
])
def test_bad_cu_seqlens_are_named(bad, message):
    with pytest.raises((ValueError, TypeError), match=None) as error:
        read_cu_seqlens(bad)
    assert message in str(error.value)
    with pytest.raises(ValueError, match="1-D integer tensor"):
        read_cu_seqlens(torch.tensor([0.0, 2.0]))

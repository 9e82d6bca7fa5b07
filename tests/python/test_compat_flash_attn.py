"""Drop-in compatibility with flash-attn's Python interfaces (flash_attn 2.x, FlashAttention 3's
flash_attn_interface, FlashAttention 4's flash_attn.cute) where flash4 follows them: option spellings that one of
them uses and the results they must give, checked against the float64 reference (attention_reference) with the
tolerance rule, and clear errors for the options flash4 does not implement. CPU."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flash4  # noqa: E402
from attention_reference import attention, check_tolerance  # noqa: E402


def _inputs(batch=2, seqlen_q=9, seqlen_k=13, heads=4, heads_kv=2, head_dim=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, seqlen_q, heads, head_dim, generator=gen),
            torch.randn(batch, seqlen_k, heads_kv, head_dim, generator=gen),
            torch.randn(batch, seqlen_k, heads_kv, head_dim, generator=gen))


def _check_float32(out, lse, q, k, v, **options):
    args = tuple(t.double().numpy() for t in (q, k, v))
    ref_out, ref_lse = attention(*args, **options)
    naive_out, naive_lse = attention(*args, **options, round_to=np.float32)
    check_tolerance("out", out.double().numpy(), ref_out, naive_out, "float32")
    check_tolerance("lse", lse.double().numpy(), ref_lse, naive_lse, "float32")


# FlashAttention 4 (flash_attn.cute) spells an unbounded window side None (its default is (None, None)).
WINDOWS_WITH_NONE = [((None, None), (-1, -1)), ((3, None), (3, -1)), ((None, 0), (-1, 0)), ((None, 2), (-1, 2)),
                     ((4, 1), (4, 1))]


@pytest.mark.parametrize("window,unbounded_as_minus_one", WINDOWS_WITH_NONE, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_window_side_none_is_unbounded(window, unbounded_as_minus_one, causal):
    q, k, v = _inputs()
    out, lse = flash4.flash_attn_func(q, k, v, causal=causal, window_size=window, return_lse=True)
    _check_float32(out, lse, q, k, v, causal=causal, window=unbounded_as_minus_one)
    same = flash4.flash_attn_func(q, k, v, causal=causal, window_size=unbounded_as_minus_one)
    assert torch.equal(out, same)


def test_window_side_none_in_every_entry_point():
    q, k, v = _inputs(batch=1, seqlen_q=13)
    window, minus_one = (5, None), (5, -1)
    cu = torch.tensor([0, 13], dtype=torch.int32)
    varlen = lambda w: flash4.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 13, 13, window_size=w)  # noqa: E731
    assert torch.equal(varlen(window), varlen(minus_one))
    qkv = torch.stack([q[:, :, :2], k, v], 2)
    packed = lambda w: flash4.flash_attn_qkvpacked_func(qkv, window_size=w)  # noqa: E731
    assert torch.equal(packed(window), packed(minus_one))
    cache = lambda w: flash4.flash_attn_with_kvcache(q, k, v, causal=True, window_size=w)  # noqa: E731
    assert torch.equal(cache(window), cache(minus_one))
    out = np.empty(q.shape, np.float32)
    flash4.forward(q.numpy(), k.numpy(), v.numpy(), out, window_size=window)
    assert np.array_equal(out, flash4.flash_attn_func(q, k, v, window_size=minus_one).numpy())


def test_varlen_block_table_takes_every_batch():
    # flash_attn 2.x's flash_attn_varlen_func takes a paged KV cache (block_table); flash4's runs decode batches
    # and batches mixing query counts (tests/python/test_kvcache.py). Here: pages of one row holding the packed
    # keys in order give the packed call's result.
    q, k, v = _inputs(batch=1)
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 6, 13], dtype=torch.int32)
    def call(**kw):
        return flash4.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 5, 7, causal=True, **kw)

    assert torch.equal(call(block_table=None), call())
    pages = torch.tensor([[0, 1, 2, 3, 4, 5, 5], [6, 7, 8, 9, 10, 11, 12]], dtype=torch.int32)
    paged = flash4.flash_attn_varlen_func(q[0], k[0][:, None], v[0][:, None], cu_q, cu_k, 5, 7, causal=True,
                                          block_table=pages)
    torch.testing.assert_close(paged, call(), rtol=1e-5, atol=1e-5)


def test_documented_positional_order_and_returns():
    # docs/python.md, "Differences from flash-attn": FlashAttention 3's order (softmax_scale, causal after v; after
    # max_seqlen_k for varlen) and its return convention, (out, lse) with return_attn_probs.
    q, k, v = _inputs(batch=1)
    out = flash4.flash_attn_func(q, k, v, 0.3, True)
    assert torch.equal(out, flash4.flash_attn_func(q, k, v, softmax_scale=0.3, causal=True))
    pair = flash4.flash_attn_func(q, k, v, 0.3, True, return_attn_probs=True)
    assert isinstance(pair, tuple) and len(pair) == 2 and torch.equal(pair[0], out)
    _check_float32(*pair, q, k, v, softmax_scale=0.3, causal=True)
    cu_q, cu_k = torch.tensor([0, 9], dtype=torch.int32), torch.tensor([0, 13], dtype=torch.int32)
    varlen = flash4.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 9, 13, 0.3, True, return_attn_probs=True)
    assert len(varlen) == 2 and torch.equal(varlen[0], out[0]) and varlen[1].shape == (4, 9)


def test_flashattention_3_and_4_scheduling_keywords():
    # FlashAttention 3 / 4 call sites pass num_splits, pack_gqa and sm_margin: taken, checked, and without effect
    # on the result; page_table is their name for block_table.
    q, k, v = _inputs()
    plain = flash4.flash_attn_func(q, k, v, causal=True)
    for hints in (dict(num_splits=1, pack_gqa=None, sm_margin=0), dict(num_splits=0, pack_gqa=True, sm_margin=8),
                  dict(num_splits=4, pack_gqa=False)):
        assert torch.equal(flash4.flash_attn_func(q, k, v, causal=True, **hints), plain)
    with pytest.raises(ValueError, match=r"num_splits = -1 must be >= 0"):
        flash4.flash_attn_func(q, k, v, num_splits=-1)
    with pytest.raises(TypeError, match=r"pack_gqa must be None, True or False, got int"):
        flash4.flash_attn_func(q, k, v, pack_gqa=1)
    with pytest.raises(ValueError, match=r"sm_margin = -2 must be >= 0"):
        flash4.flash_attn_func(q, k, v, sm_margin=-2)
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 6, 13], dtype=torch.int32)
    varlen = flash4.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 5, 7, causal=True)
    assert torch.equal(flash4.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 5, 7, causal=True, num_splits=3,
                                                     pack_gqa=True, sm_margin=4), varlen)
    pages = torch.tensor([[0, 1, 2, 3, 4, 5, 5], [6, 7, 8, 9, 10, 11, 12]], dtype=torch.int32)
    args = (q[0], k[0][:, None], v[0][:, None], cu_q, cu_k, 5, 7)
    assert torch.equal(flash4.flash_attn_varlen_func(*args, causal=True, page_table=pages),
                       flash4.flash_attn_varlen_func(*args, causal=True, block_table=pages))
    with pytest.raises(ValueError, match="block_table and page_table are both set"):
        flash4.flash_attn_varlen_func(*args, block_table=pages, page_table=pages)

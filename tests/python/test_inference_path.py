"""Calls with nothing to differentiate (torch.no_grad, inference mode, inputs that do not require grad) skip
autograd's bookkeeping and, without return_lse, the LSE: the kernels then run without an LSE output. The output
must be the one of the full path bit for bit, on every route (dense, GQA, packed, the decode route, a sink)."""

import pytest

torch = pytest.importorskip("torch")

import flash4  # noqa: E402
from flash4 import _torch_ops  # noqa: E402
from torch_devices import DEVICES  # noqa: E402


def _inputs(device, dtype, b, sq, sk, h, hkv, d, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, n, d, generator=g).to(device=device, dtype=dtype)
            for s, n in ((sq, h), (sk, hkv), (sk, hkv))]


def _dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, causal, window", [
    ((2, 77, 77, 4, 4, 64), True, (-1, -1)),      # dense, odd length
    ((1, 300, 300, 8, 2, 128), True, (40, 0)),    # GQA 4:1, sliding window
    ((3, 1, 513, 8, 2, 128), True, (-1, -1)),     # one query token: the decode route on the GPU
    ((2, 129, 1000, 4, 1, 256), False, (-1, -1)),  # MQA, seqlen_q != seqlen_k
])
def test_no_grad_output_equals_the_full_path(device, shape, causal, window):
    q, k, v = _inputs(device, _dtype(device), *shape, seed=1)
    full, lse = flash4.flash_attn_func(q, k, v, causal=causal, window_size=window, return_lse=True)
    with torch.no_grad():
        fast = flash4.flash_attn_func(q, k, v, causal=causal, window_size=window)
        fast_out, fast_lse = flash4.flash_attn_func(q, k, v, causal=causal, window_size=window, return_lse=True)
    assert torch.equal(fast, full) and torch.equal(fast_out, full) and torch.equal(fast_lse, lse)
    with torch.inference_mode():
        assert torch.equal(flash4.flash_attn_func(q, k, v, causal=causal, window_size=window), full)


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad_packed_batch_and_sink(device):
    dtype = _dtype(device)
    lengths = [5, 0, 130, 1]
    cu = torch.tensor([0, 5, 5, 135, 136], dtype=torch.int32, device=device)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(136, n, 64, generator=g).to(device=device, dtype=dtype) for n in (6, 2, 2))
    sink = torch.randn(6, generator=g).to(device)
    args = dict(causal=True, learnable_sink=sink)
    full, lse = flash4.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), return_lse=True, **args)
    with torch.no_grad():
        fast = flash4.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), **args)
    assert torch.equal(fast, full)
    assert torch.isfinite(lse).all()


def test_the_fast_path_passes_no_lse_and_keeps_autograd_where_needed(monkeypatch):
    seen = []

    class Recorder:
        def forward(self, q, k, v, out, lse, *args, **kwargs):
            seen.append(lse)

    monkeypatch.setattr(_torch_ops, "_C", Recorder())
    q, k, v = _inputs("cpu", torch.float32, 1, 8, 8, 2, 2, 64, seed=3)
    out = flash4.flash_attn_func(q, k, v)
    assert seen[-1] is None and out.grad_fn is None and not out.requires_grad
    flash4.flash_attn_func(q, k, v, return_lse=True)
    assert seen[-1] is not None  # asked for
    q.requires_grad_(True)
    out = flash4.flash_attn_func(q, k, v)
    assert seen[-1] is not None and out.grad_fn is not None  # the backward needs it
    with torch.no_grad():
        flash4.flash_attn_func(q, k, v)
    assert seen[-1] is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_without_lse_equals_with_it(device, paged):
    # flash_attn_with_kvcache without return_softmax_lse passes no LSE to the kernels (decode, split merge, packed
    # queries); the output is the same bit for bit. Two calls on fresh copies of the caches (each appends).
    dtype = _dtype(device)
    g = torch.Generator().manual_seed(4)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    lengths = torch.tensor([37, 300, 1], dtype=torch.int32, device=device)
    q, k_new, v_new = rnd(3, 2, 8, 128), rnd(3, 2, 2, 128), rnd(3, 2, 2, 128)
    if paged:
        cache_shape, table = (20, 64, 2, 128), torch.randperm(20, generator=g)[:18].view(3, 6).to(torch.int32)
        table = table.to(device)
    else:
        cache_shape, table = (3, 310, 2, 128), None
    k_cache, v_cache = rnd(*cache_shape), rnd(*cache_shape)

    def run(**kw):
        kc, vc = k_cache.clone(), v_cache.clone()
        return flash4.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lengths, block_table=table,
                                             causal=True, **kw), kc
    (full, lse), kc_full = run(return_softmax_lse=True)
    fast, kc_fast = run()
    assert torch.equal(fast, full) and torch.equal(kc_fast, kc_full) and torch.isfinite(lse).all()
    # Packed queries (counts 2, 0, 1), no append.
    cu = torch.tensor([0, 2, 2, 3], dtype=torch.int32, device=device)
    packed = dict(cache_seqlens=lengths, block_table=table, causal=True, cu_seqlens_q=cu, max_seqlen_q=2)
    full, _ = flash4.flash_attn_with_kvcache(q[:, 0][:3], k_cache, v_cache, return_softmax_lse=True, **packed)
    assert torch.equal(flash4.flash_attn_with_kvcache(q[:, 0][:3], k_cache, v_cache, **packed), full)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_without_lse_equals_with_it(device):
    # The FP8 forward (forward only) passes no LSE when none is asked for; the output is the same bit for bit.
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 300, n, 128, generator=g).to(device).to(torch.float8_e4m3fn) for n in (8, 2, 2))
    descale = torch.full((2, 2), 0.5, device=device)
    out, lse = flash4.flash_attn_func(q, k, v, causal=True, q_descale=descale, k_descale=descale, return_lse=True)
    fast = flash4.flash_attn_func(q, k, v, causal=True, q_descale=descale, k_descale=descale)
    assert torch.equal(fast, out) and torch.isfinite(lse).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("counts", [[2, 2, 2], [2, 1, 0]])  # the uniform (batch, 2) view, packed queries
def test_paged_varlen_without_lse_equals_with_it(device, counts):
    dtype = _dtype(device)
    g = torch.Generator().manual_seed(6)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    q, k_pool, v_pool = rnd(sum(counts), 8, 64), rnd(12, 16, 2, 64), rnd(12, 16, 2, 64)
    table = torch.randperm(12, generator=g)[:9].view(3, 3).to(device=device, dtype=torch.int32)
    cu = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32, device=device)
    used = torch.tensor([40, 7, 33], dtype=torch.int32, device=device)
    args = (q, k_pool, v_pool, cu, None, max(counts), 48)
    kw = dict(seqused_k=used, block_table=table, causal=True)
    full, lse = flash4.flash_attn_varlen_func(*args, return_lse=True, **kw)
    assert torch.equal(flash4.flash_attn_varlen_func(*args, **kw), full) and lse.shape == (8, sum(counts))

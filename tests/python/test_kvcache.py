"""flash4.flash_attn_with_kvcache on the CPU against a float64 model written here: the append (with rotary
in float64, rounded to the dtype as the cache stores it) and, per sequence, attention on the keys gathered from
the cache (attention_reference: the fp64 reference, the naive same-dtype baseline and the tolerance rule). The
custom op under torch.compile, the in-place append, and the refusal of bad arguments."""

import copy
import functools
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flash4  # noqa: E402
from attention_reference import attention, check_tolerance  # noqa: E402
from torch_devices import hopper_present  # noqa: E402

NP_DTYPES = {torch.float32: None, torch.float16: np.float16}
NAMES = {torch.float32: "float32", torch.float16: "float16"}


def rope_tables(seqlen_ro, rotary_dim, dtype):
    inv = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angle = torch.arange(seqlen_ro, dtype=torch.float64)[:, None] * inv[None, :]
    return angle.cos().to(dtype), angle.sin().to(dtype)


def rotate(x, cos, sin, interleaved):
    """x (..., head_dim) float64 rotated with rows cos, sin (..., rotary_dim / 2) float64."""
    r = cos.shape[-1] * 2
    x = x.clone()
    if interleaved:
        a, b = x[..., 0:r:2].clone(), x[..., 1:r:2].clone()
        x[..., 0:r:2], x[..., 1:r:2] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., : r // 2].clone(), x[..., r // 2 : r].clone()
        x[..., : r // 2], x[..., r // 2 : r] = a * cos - b * sin, a * sin + b * cos
    return x


class Case:
    def __init__(self, batch, seqlen_q, heads, heads_kv, lengths, seqlen_new=0, page_size=0, dtype=torch.float32,
                 rotary=None, causal=False, window=(-1, -1), softcap=0.0, sink=False, cache_batch_idx=False,
                 head_dim=64, seed=0, leftpad=None):
        g = torch.Generator().manual_seed(seed)
        rnd = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
        self.dtype, self.causal, self.window, self.softcap, self.rotary = dtype, causal, window, softcap, rotary
        self.lengths = lengths
        self.leftpad = leftpad  # per sequence: rows before its first key (cache_leftpad), or None
        self.q = rnd(batch, seqlen_q, heads, head_dim)
        self.k = rnd(batch, seqlen_new, heads_kv, head_dim) if seqlen_new else None
        self.v = rnd(batch, seqlen_new, heads_kv, head_dim) if seqlen_new else None
        max_keys = max(lengths) + seqlen_new
        if page_size:
            max_pages = -(-max_keys // page_size) + 1
            pool = batch * max_pages + 3
            perm = torch.randperm(pool, generator=g)
            self.block_table = torch.full((batch, max_pages), -1, dtype=torch.int32)
            for b in range(batch):
                used = -(-(lengths[b] + seqlen_new) // page_size)
                self.block_table[b, :used] = perm[b * max_pages : b * max_pages + used].to(torch.int32)
            shape = (pool, page_size, heads_kv, head_dim)
            self.cache_batch_idx = None
        else:
            self.block_table = None
            rows = batch + 2 if cache_batch_idx else batch
            perm = torch.randperm(rows, generator=g)[:batch].to(torch.int32)
            self.cache_batch_idx = perm if cache_batch_idx else None
            shape = (rows, max_keys + 3, heads_kv, head_dim)
        self.k_cache, self.v_cache = rnd(*shape), rnd(*shape)
        self.page_size = page_size
        self.cache_seqlens = torch.tensor(lengths, dtype=torch.int32)
        self.sink = torch.randn(heads, generator=g, dtype=torch.float32) if sink else None
        self.cos = self.sin = None
        if rotary is not None:
            self.cos, self.sin = rope_tables(max_keys + seqlen_q + 2, head_dim, dtype)

    def slot(self, b, j):
        if self.block_table is not None:
            return int(self.block_table[b, j // self.page_size]), j % self.page_size
        return (int(self.cache_batch_idx[b]) if self.cache_batch_idx is not None else b), j

    def run(self, **kw):
        self.k_cache_in, self.v_cache_in = self.k_cache.clone(), self.v_cache.clone()
        return flash4.flash_attn_with_kvcache(
            self.q, self.k_cache, self.v_cache, self.k, self.v, rotary_cos=self.cos, rotary_sin=self.sin,
            cache_seqlens=self.cache_seqlens, cache_batch_idx=self.cache_batch_idx, block_table=self.block_table,
            causal=self.causal, window_size=self.window, softcap=self.softcap,
            rotary_interleaved=self.rotary == "interleaved", return_softmax_lse=True, learnable_sink=self.sink,
            **{"cache_leftpad": None if self.leftpad is None else torch.tensor(self.leftpad, dtype=torch.int32),
               **kw})

    def check(self, out, lse):
        kc, vc = self.k_cache_in.double(), self.v_cache_in.double()
        seqlen_new = 0 if self.k is None else self.k.shape[1]
        seqlen_q = self.q.shape[1]
        per_row = self.causal or self.window != (-1, -1)
        for b, length in enumerate(self.lengths):
            for t in range(seqlen_new):
                x = self.k[b, t].double()
                if self.rotary is not None:
                    x = rotate(x, self.cos[length + t].double(), self.sin[length + t].double(),
                               self.rotary == "interleaved").to(self.dtype).double()
                s, r = self.slot(b, length + t)
                kc[s, r], vc[s, r] = x, self.v[b, t].double()
        # The append, in place: rotated rows within the rotation's rounding, everything else exact.
        tol = 0.0 if self.rotary is None else (4e-3 if self.dtype == torch.float16 else 1e-6)
        assert torch.allclose(self.k_cache.double(), kc, rtol=tol, atol=tol), "k_cache after the append"
        assert torch.equal(self.v_cache.double(), vc), "v_cache after the append"
        for b, length in enumerate(self.lengths):
            n = length + seqlen_new
            first = 0 if self.leftpad is None else self.leftpad[b]  # rows before it are padding
            rows = [self.slot(b, j) for j in range(first, n)]
            n -= first
            kb = torch.stack([kc[s, r] for s, r in rows]) if n else kc[:0, 0]
            vb = torch.stack([vc[s, r] for s, r in rows]) if n else vc[:0, 0]
            qb = self.q[b].double()
            if self.rotary is not None:
                pos = [length + (i if per_row else 0) for i in range(seqlen_q)]
                qb = rotate(qb, self.cos[pos].double()[:, None], self.sin[pos].double()[:, None],
                            self.rotary == "interleaved").to(self.dtype).double()
            args = (qb[None].numpy(), kb[None].numpy(), vb[None].numpy())
            kw = dict(causal=self.causal, window=self.window, softcap=self.softcap)
            ref_out, ref_lse = attention(*args, **kw)
            naive_out, naive_lse = attention(*args, **kw, round_to=NP_DTYPES[self.dtype])
            if self.sink is not None:  # the sink: one more logit in the denominator, carrying no value
                sink = self.sink.double().numpy()[None, :, None]
                for o, lse_ in ((ref_out, ref_lse), (naive_out, naive_lse)):
                    total = np.logaddexp(lse_, sink)
                    o *= np.nan_to_num(np.exp(lse_ - total)).transpose(0, 2, 1)[..., None]
                    lse_[...] = total
                if NP_DTYPES[self.dtype] is not None:  # the naive output is stored in the dtype after the sink
                    naive_out = naive_out.astype(NP_DTYPES[self.dtype]).astype(np.float64)
            name = NAMES[self.dtype]
            check_tolerance(f"out[{b}]", out[b : b + 1].double().numpy(), ref_out, naive_out, name)
            check_tolerance(f"lse[{b}]", lse[b : b + 1].double().numpy(), ref_lse, naive_lse, "float32")


@pytest.mark.parametrize("page_size", [0, 1, 16, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_and_append(page_size, dtype):
    c = Case(3, 1, 4, 2, [17, 0, 300], seqlen_new=1, page_size=page_size, dtype=dtype)
    c.check(*c.run())


@pytest.mark.parametrize("rotary", ["interleaved", "neox"])
@pytest.mark.parametrize("causal", [True, False])
def test_rotary(rotary, causal):
    c = Case(2, 3, 4, 2, [10, 41], seqlen_new=3, page_size=16, rotary=rotary, causal=causal, dtype=torch.float16)
    c.check(*c.run())


def test_masks_softcap_sink_gqa_splits():
    for splits in (1, 3, 0):
        c = Case(2, 5, 8, 2, [100, 0], seqlen_new=2, causal=True, window=(20, 0), softcap=4.0, sink=True,
                 cache_batch_idx=True, seed=splits)
        c.check(*c.run(num_splits=splits))


def test_int64_indices_are_converted():
    c = Case(2, 1, 2, 1, [7, 30], seqlen_new=1, page_size=16)
    c.cache_seqlens, c.block_table = c.cache_seqlens.long(), c.block_table.long()
    c.check(*c.run())


def test_int64_indices_beyond_int32_are_refused():
    c = Case(2, 1, 2, 1, [7, 30], seqlen_new=1, page_size=16)
    wrapped = c.cache_seqlens.long() + 2**32  # would read as the valid lengths after an int32 cast
    with pytest.raises(ValueError, match=r"cache_seqlens holds 4294967303, outside int32's range"):
        flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, cache_seqlens=wrapped, block_table=c.block_table)
    with pytest.raises(ValueError, match=r"block_table holds"):
        flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, cache_seqlens=c.cache_seqlens,
                                       block_table=c.block_table.long() - 2**32)


def test_sink_of_any_float_dtype_is_cast_as_flash_attn_func_does():
    c = Case(2, 3, 4, 2, [7, 12], dtype=torch.float16, sink=True)
    rounded = c.sink.to(torch.bfloat16)  # a bf16 parameter, whatever q's dtype
    c.sink = rounded.float()  # the reference: the bf16 parameter's own values in float32
    out, lse = c.run()
    c.check(out, lse)
    c.sink = rounded  # the bf16 parameter itself: the same call after the cast
    out_bf16, lse_bf16 = c.run()
    assert torch.equal(out_bf16, out) and torch.equal(lse_bf16, lse)
    for bad, error, pattern in ((torch.tensor([1, 2, 3, 4]), TypeError, "learnable_sink has dtype torch.int64"),
                                ([0.1] * 4, TypeError, "learnable_sink must be a torch.Tensor"),
                                (torch.randn(3), ValueError, r"learnable_sink.shape\[0\]")):
        c.sink = bad
        with pytest.raises(error, match=pattern):
            c.run()


def test_int_cache_seqlens_and_no_lse():
    c = Case(2, 1, 2, 1, [12, 12], seqlen_new=1)
    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    out = flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, c.k, c.v, cache_seqlens=12)
    _, lse = c.run()  # the same keys again: cache_seqlens 12 from the tensor, appending the same k, v
    c.check(out, lse)


def test_compile_fullgraph():
    c = Case(2, 1, 4, 2, [20, 7], seqlen_new=1, page_size=16)

    def step(q, k_cache, v_cache, k, v, lengths, table):
        return flash4.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, block_table=table,
                                             return_softmax_lse=True)

    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    out, lse = torch.compile(step, fullgraph=True)(c.q, c.k_cache, c.v_cache, c.k, c.v, c.cache_seqlens,
                                                    c.block_table)
    c.check(out, lse)  # the append happened inside the compiled graph


def test_opcheck():
    from flash4 import _torch_kvcache

    c = Case(1, 2, 2, 1, [9], seqlen_new=2)
    args = (c.q, c.k_cache, c.v_cache, c.k, c.v, None, None, c.cache_seqlens, -1, None, None,
            torch.tensor([1], dtype=torch.int32), None, 1.0 / math.sqrt(64), True, -1, -1, 0.0, True, 0)
    # The append is not idempotent (the same rows written again); the checks only compare schema and fakes.
    torch.library.opcheck(_torch_kvcache.fwd_kvcache, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_eager_append_bumps_the_cache_versions():
    # Eager calls skip the custom op's dispatch; autograd must still see the in-place append (and only it).
    c = Case(1, 1, 2, 1, [9], seqlen_new=1)
    versions = c.k_cache._version, c.v_cache._version
    flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, cache_seqlens=c.cache_seqlens)
    assert (c.k_cache._version, c.v_cache._version) == versions  # attending alone writes nothing
    out, lse = c.run()
    assert c.k_cache._version > versions[0] and c.v_cache._version > versions[1]
    c.check(out, lse)


def test_bad_arguments_write_nothing():
    c = Case(2, 1, 2, 1, [5, 60], seqlen_new=1, page_size=16)
    before = c.k_cache.clone()
    bad = c.block_table.clone()
    bad[1, 0] = 10_000
    with pytest.raises(ValueError, match=r"block_table\[1\]\[0\] = 10000"):
        flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, c.k, c.v, cache_seqlens=c.cache_seqlens,
                                       block_table=bad)
    with pytest.raises(ValueError, match="the append would overflow"):
        too_long = torch.tensor([5, 80], dtype=torch.int32)  # 80 + 1 new key > 5 pages of 16
        flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, c.k, c.v, cache_seqlens=too_long,
                                       block_table=c.block_table)
    with pytest.raises(TypeError, match="cache_seqlens.dtype is fp32 but must be int32"):
        flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, c.k, c.v, cache_seqlens=c.cache_seqlens.float(),
                                       block_table=c.block_table)
    with pytest.raises(ValueError, match="cache_batch_idx is set with block_table"):
        flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, c.k, c.v, cache_seqlens=c.cache_seqlens,
                                       cache_batch_idx=c.cache_seqlens, block_table=c.block_table)
    with pytest.raises(ValueError, match="cache_leftpad is set with block_table"):
        flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, cache_leftpad=c.cache_seqlens,
                                       block_table=c.block_table)
    # A wrong rank names the argument's own layout.
    with pytest.raises(ValueError, match=r"block_table must have 2 dimensions \(batch, max_pages\)"):
        flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, c.k, c.v, cache_seqlens=c.cache_seqlens,
                                       block_table=c.block_table[0])
    cos, sin = rope_tables(64, 8, c.q.dtype)
    with pytest.raises(ValueError, match=r"rotary_cos must have 2 dimensions \(seqlen_ro, rotary_dim / 2\)"):
        flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, c.k, c.v, rotary_cos=cos[None], rotary_sin=sin,
                                       cache_seqlens=c.cache_seqlens, block_table=c.block_table)
    assert torch.equal(c.k_cache, before)


@pytest.mark.parametrize(
    "options,error,pattern",
    [
        ({"cache_seqlens": -1}, ValueError, r"cache_seqlens = -1 must be >= 0"),
        ({"cache_seqlens": True}, TypeError, r"cache_seqlens must be an int or an int32 torch.Tensor"),
        ({"cache_seqlens": 3.5}, TypeError, r"cache_seqlens must be an int or an int32 torch.Tensor.*float 3.5"),
        ({"cache_seqlens": [3, 4]}, TypeError, r"cache_seqlens must be an int or an int32 torch.Tensor.*list"),
        ({"num_splits": 1.5}, TypeError, r"num_splits must be an int; got float 1.5"),
        ({"num_splits": None}, TypeError, r"num_splits must be an int; got NoneType None"),
        ({"num_splits": 2**40}, ValueError, r"num_splits = 1099511627776 must be <= 2147483647"),
    ],
)
def test_integer_arguments_are_named(options, error, pattern):
    q, k_cache, v_cache = torch.zeros(2, 1, 2, 32), torch.zeros(2, 8, 1, 32), torch.zeros(2, 8, 1, 32)
    with pytest.raises(error, match=pattern):
        flash4.flash_attn_with_kvcache(q, k_cache, v_cache, **{"cache_seqlens": 3, **options})


def test_append_into_caches_that_share_elements_is_refused():
    # New keys and values written over each other (one tensor for both caches, or views one row apart) would
    # corrupt the cache: refused before anything is written; interleaved halves of one buffer are fine.
    c = Case(2, 1, 2, 1, [5, 60], seqlen_new=1, page_size=0)
    before = c.k_cache.clone()
    with pytest.raises(ValueError, match="k_cache and v_cache share elements"):
        flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.k_cache, c.k, c.v, cache_seqlens=c.cache_seqlens)
    buffer = torch.cat([c.k_cache, c.k_cache[:, :1]], dim=1)
    with pytest.raises(ValueError, match="k_cache and v_cache share elements"):
        flash4.flash_attn_with_kvcache(c.q, buffer[:, :-1], buffer[:, 1:], c.k, c.v, cache_seqlens=c.cache_seqlens)
    assert torch.equal(c.k_cache, before)
    pair = torch.stack([c.k_cache, c.v_cache], dim=3)  # (batch, rows, heads_kv, 2, d): K and V interleaved
    expected = flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, c.k, c.v, cache_seqlens=c.cache_seqlens)
    out = flash4.flash_attn_with_kvcache(c.q, pair[:, :, :, 0], pair[:, :, :, 1], c.k, c.v,
                                         cache_seqlens=c.cache_seqlens)
    assert torch.equal(out, expected)
    assert torch.equal(pair[:, :, :, 0], c.k_cache) and torch.equal(pair[:, :, :, 1], c.v_cache)


def test_integer_cache_seqlens_equals_the_tensor():
    torch.manual_seed(0)
    q, k_cache, v_cache = torch.randn(2, 1, 2, 32), torch.randn(2, 8, 1, 32), torch.randn(2, 8, 1, 32)
    lengths = torch.tensor([3, 3], dtype=torch.int32)
    expected = flash4.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    assert torch.equal(flash4.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=np.int32(3)), expected)


def test_query_of_the_wrong_rank_is_named():
    k_cache = torch.zeros(2, 8, 1, 32)
    with pytest.raises(ValueError, match=r"q must have 4 dimensions \(batch, seqlen_q, heads, head_dim\), got shape"):
        flash4.flash_attn_with_kvcache(torch.zeros(2, 32), k_cache, k_cache, cache_seqlens=3)


def test_arguments_that_are_not_tensors_are_named():
    q = torch.randn(1, 1, 2, 64)
    cache = torch.zeros(1, 8, 2, 64)
    with pytest.raises(TypeError, match=r"k_cache must be a torch.Tensor like q, got builtins.list"):
        flash4.flash_attn_with_kvcache(q, [0.0], cache)
    with pytest.raises(TypeError, match=r"v must be a torch.Tensor like q, got numpy.ndarray"):
        flash4.flash_attn_with_kvcache(q, cache, cache.clone(), q[:, :, :2], q[:, :, :2].numpy())
    with pytest.raises(ValueError, match=r"q is on the meta device; flash4 runs on cpu and cuda tensors"):
        flash4.flash_attn_with_kvcache(q.to("meta"), cache, cache.clone())


def _paged_varlen(c, seqlen_q, **kw):
    """flash_attn_varlen_func with c's paged cache: q packed, one segment of seqlen_q queries per sequence."""
    batch = c.q.shape[0]
    cu_q = torch.arange(batch + 1, dtype=torch.int32) * seqlen_q
    cu_k = torch.cat([torch.zeros(1, dtype=torch.int32), c.cache_seqlens.cumsum(0).to(torch.int32)])
    args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=seqlen_q, max_seqlen_k=max(c.lengths),
                causal=c.causal, window_size=c.window, softcap=c.softcap, learnable_sink=c.sink,
                block_table=c.block_table, return_lse=True)
    args.update(kw)
    return flash4.flash_attn_varlen_func(c.q.flatten(0, 1), c.k_cache, c.v_cache, **args)


@pytest.mark.parametrize("seqlen_q", [1, 3])
@pytest.mark.parametrize("lengths_from", ["cu_seqlens_k", "seqused_k"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_varlen_with_block_table(seqlen_q, lengths_from, page_size):
    # flash-attn 2's paged varlen call (serving engines' decode step): keys of sequence b in block_table's row b,
    # as many as cu_seqlens_k's segment b (or seqused_k[b]); lse (heads, total_q) as a packed call returns it.
    c = Case(3, seqlen_q, 4, 2, [17, 1, 300], page_size=page_size, dtype=torch.float16, causal=True, sink=True,
             seed=5)
    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    kw = {} if lengths_from == "cu_seqlens_k" else dict(cu_seqlens_k=None, seqused_k=c.cache_seqlens)
    out, lse = _paged_varlen(c, seqlen_q, **kw)
    assert out.shape == (3 * seqlen_q, 4, 64) and lse.shape == (4, 3 * seqlen_q)
    c.check(out.unflatten(0, (3, seqlen_q)), lse.unflatten(1, (3, seqlen_q)).transpose(0, 1))
    c.window = (40, 0)  # a window, and the result without lse
    c.check(_paged_varlen(c, seqlen_q, return_lse=False, **kw).unflatten(0, (3, seqlen_q)),
            _paged_varlen(c, seqlen_q, **kw)[1].unflatten(1, (3, seqlen_q)).transpose(0, 1))


def _mixed_paged_varlen(c, counts, extra_rows, **kw):
    """flash_attn_varlen_func with c's paged cache on a batch mixing query counts: sequence b's queries are the
    first counts[b] rows of c.q[b]; extra_rows rows after the last segment belong to no sequence."""
    rows = [c.q[b, :n] for b, n in enumerate(counts)] + [c.q[0, :extra_rows]]
    cu_q = torch.tensor([0, *np.cumsum(counts)], dtype=torch.int32, device=c.q.device)
    lengths = c.cache_seqlens
    args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=None, seqused_k=lengths, max_seqlen_q=max(counts),
                max_seqlen_k=max(c.lengths), causal=c.causal, window_size=c.window, softcap=c.softcap,
                learnable_sink=c.sink, block_table=c.block_table, return_lse=True)
    args.update(kw)
    return flash4.flash_attn_varlen_func(torch.cat(rows), c.k_cache, c.v_cache, **args)


def _check_mixed(c, counts, out, lse):
    """Each sequence's rows against the fp64 model of its own flash_attn_with_kvcache problem (Case.check on the
    one-sequence case); rows after the last segment must be 0 with lse -inf."""
    start = 0
    for b, n in enumerate(counts):
        if n == 0:  # no row to check (the fp64 model takes no empty q)
            continue
        one = copy.copy(c)
        one.q, one.lengths, one.cache_seqlens = c.q[b : b + 1, :n], [c.lengths[b]], c.cache_seqlens[b : b + 1]
        if c.block_table is not None:
            one.block_table = c.block_table[b : b + 1]
        else:  # the sequence's cache row, as the one-sequence case finds it
            one.cache_batch_idx = (c.cache_batch_idx[b : b + 1] if c.cache_batch_idx is not None
                                   else torch.tensor([b], dtype=torch.int32))
        one.check(out[None, start : start + n], lse[None, :, start : start + n])
        start += n
    assert torch.equal(out[start:], torch.zeros_like(out[start:])), "rows in no sequence"
    assert torch.equal(lse[:, start:], torch.full_like(lse[:, start:], float("-inf"))), "lse of rows in no sequence"


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("window", [(-1, -1), (30, 0)])
def test_varlen_with_block_table_mixing_query_counts(page_size, window):
    # Chunked prefill beside decode steps (vLLM's batches): query counts 5, 1, 0, 3, 1, and two rows after the
    # last segment; keys from seqused_k.
    counts = [5, 1, 0, 3, 1]
    c = Case(5, 5, 4, 2, [17, 40, 3, 300, 2], page_size=page_size, dtype=torch.float16, causal=True, sink=True,
             window=window, seed=7)
    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    out, lse = _mixed_paged_varlen(c, counts, extra_rows=2)
    assert out.shape == (12, 4, 64) and lse.shape == (4, 12)
    _check_mixed(c, counts, out, lse)
    assert torch.equal(_mixed_paged_varlen(c, counts, 2, return_lse=False), out)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_with_block_table_mixed_counts_softcap_mqa(causal):
    # The packed-query path without a causal mask, with softcap and MQA (8 query heads on one KV head); counts up
    # to the 16-query limit.
    counts = [16, 2, 7, 1]
    c = Case(4, 16, 8, 1, [50, 16, 300, 1], page_size=16, dtype=torch.float16, causal=causal, softcap=20.0,
             seed=11)
    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    out, lse = _mixed_paged_varlen(c, counts, extra_rows=0)
    _check_mixed(c, counts, out, lse)


def test_varlen_with_block_table_prefill_chunks_beside_decode_steps():
    # A segment longer than the decode kernel's 16 queries (a prefill chunk) in the same packed call; rows after
    # the last segment as before.
    counts = [20, 1, 0, 3, 1]
    c = Case(5, 20, 4, 2, [17, 40, 3, 300, 2], page_size=16, dtype=torch.float16, causal=True, seed=9)
    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    out, lse = _mixed_paged_varlen(c, counts, extra_rows=2)
    _check_mixed(c, counts, out, lse)


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("counts, extra_rows, host_offsets", [([40, 1, 0, 17, 16], 2, False),
                                                              ([24, 24, 9], 15, False), ([24, 24, 9], 15, True)])
def test_varlen_with_block_table_prefill_chunks_with_cuda_offsets(counts, extra_rows, host_offsets):
    # CUDA offsets, pages of 256 (whole dense K/V tiles): the segments of more than 16 queries run on the dense
    # kernel beside the decode kernel's, both reading the offsets on the device. The second batch has
    # batch * max_seqlen_q rows but shorter segments and 15 rows in none, which no host code sees. The third gives
    # the same offsets on the CPU with CUDA tensors: checked on the host, then copied to the GPU.
    c = Case(len(counts), max(counts), 8, 2, [300, 17, 3, 700, 40][: len(counts)], page_size=256,
             dtype=torch.float16, causal=True, sink=True, seed=12)
    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    cuda = copy.copy(c)
    for name in ("q", "k_cache", "v_cache", "cache_seqlens", "block_table", "sink"):
        setattr(cuda, name, getattr(c, name).cuda())
    kw = {}
    if host_offsets:
        kw["cu_seqlens_q"] = torch.tensor([0, *np.cumsum(counts)], dtype=torch.int32)
    out, lse = _mixed_paged_varlen(cuda, counts, extra_rows=extra_rows, **kw)
    assert out.shape[0] == sum(counts) + extra_rows
    _check_mixed(c, counts, out.cpu(), lse.cpu())


def _packed_kvcache(c, counts, extra_rows, **kw):
    """flash_attn_with_kvcache with cu_seqlens_q on c's cache: sequence b's queries are the first counts[b] rows of
    c.q[b]; extra_rows rows after the last segment belong to no sequence."""
    rows = [c.q[b, :n] for b, n in enumerate(counts)] + [c.q[0, :extra_rows]]
    cu_q = torch.tensor([0, *np.cumsum(counts)], dtype=torch.int32, device=c.q.device)
    args = dict(cache_seqlens=c.cache_seqlens, cache_batch_idx=c.cache_batch_idx, block_table=c.block_table,
                causal=c.causal, window_size=c.window, softcap=c.softcap, learnable_sink=c.sink,
                return_softmax_lse=True, cu_seqlens_q=cu_q, max_seqlen_q=max(counts))
    args.update(kw)
    return flash4.flash_attn_with_kvcache(torch.cat(rows), c.k_cache, c.v_cache, **args)


@pytest.mark.parametrize("page_size", [0, 16])
def test_kvcache_packed_queries(page_size):
    # FlashAttention-3's cu_seqlens_q: counts 3, 1, 0, 2, 1 against caches of 17 .. 300 keys, GQA 2:1, causal
    # per sequence, a window, the sink; contiguous caches through cache_batch_idx.
    counts = [3, 1, 0, 2, 1]
    c = Case(5, 3, 4, 2, [17, 40, 3, 300, 2], page_size=page_size, dtype=torch.float16, causal=True, sink=True,
             window=(30, 0), cache_batch_idx=page_size == 0, seed=12)
    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    out, lse = _packed_kvcache(c, counts, extra_rows=2)
    assert out.shape == (9, 4, 64) and lse.shape == (4, 9)
    _check_mixed(c, counts, out, lse)
    assert torch.equal(_packed_kvcache(c, counts, 2, return_softmax_lse=False), out)


def test_page_table_is_block_table():
    # FlashAttention-3's keyword for the paged cache's table (SGLang's decode call: packed queries, page_table).
    counts = [2, 1]
    c = Case(2, 2, 4, 2, [20, 7], page_size=16, seed=15)
    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    out, lse = _packed_kvcache(c, counts, 0, block_table=None, page_table=c.block_table)
    _check_mixed(c, counts, out, lse)
    with pytest.raises(ValueError, match=r"block_table and page_table are both set"):
        _packed_kvcache(c, counts, 0, page_table=c.block_table)


def test_check_kvcache_indices():
    # The opt-in host check (FLASH4_CHECK_OFFSETS=1 runs it before CUDA calls): the library's CPU validation of the
    # index values, on copies of the index tensors and stand-ins for the data.
    c = Case(3, 2, 4, 2, [20, 7, 30], page_size=16, seed=16)
    args = dict(cache_seqlens=c.cache_seqlens, block_table=c.block_table)
    assert flash4.check_kvcache_indices(c.q, c.k_cache, c.v_cache, **args) is None
    long = c.cache_seqlens.clone()
    long[2] = 10 ** 6
    with pytest.raises(ValueError, match=r"cache_seqlens\[2\] = 1000000 exceeds the cache's capacity"):
        flash4.check_kvcache_indices(c.q, c.k_cache, c.v_cache, cache_seqlens=long, block_table=c.block_table)
    table = c.block_table.clone()
    table[1, 0] = c.k_cache.shape[0]
    with pytest.raises(ValueError, match=r"block_table\[1\]\[0\] = .* but must be in \[0, "):
        flash4.check_kvcache_indices(c.q, c.k_cache, c.v_cache, cache_seqlens=c.cache_seqlens, block_table=table)
    k_new = torch.zeros(3, 40, 2, 64)
    with pytest.raises(ValueError, match=r"the append would overflow the sequence's cache"):
        flash4.check_kvcache_indices(c.q, c.k_cache, c.v_cache, k_new, k_new, **args)
    q = c.q.flatten(0, 1)[:4]
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be non-decreasing"):
        flash4.check_kvcache_indices(q, c.k_cache, c.v_cache, **args, max_seqlen_q=2,
                                     cu_seqlens_q=torch.tensor([0, 2, 1, 4], dtype=torch.int32))
    assert flash4.check_kvcache_indices(q, c.k_cache, c.v_cache, **args, max_seqlen_q=2,
                                        cu_seqlens_q=torch.tensor([0, 2, 3, 4], dtype=torch.int32)) is None


def test_kvcache_packed_queries_without_sequences():
    # cu_seqlens_q = [0]: no sequence, so every row of q is in none (out 0, lse -inf); and an empty q.
    q, cache = torch.randn(3, 4, 64), torch.randn(2, 16, 2, 64)
    out, lse = flash4.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=torch.zeros(0, dtype=torch.int32),
                                              cu_seqlens_q=torch.zeros(1, dtype=torch.int32), max_seqlen_q=1,
                                              return_softmax_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(lse, torch.full_like(lse, float("-inf")))
    none = torch.zeros(3, dtype=torch.int32)
    out, lse = flash4.flash_attn_with_kvcache(q[:0], cache, cache.clone(), cu_seqlens_q=none, max_seqlen_q=0,
                                              return_softmax_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)


def test_kvcache_packed_queries_refusals():
    c = Case(2, 2, 4, 2, [9, 33], seqlen_new=1, page_size=16, seed=13)
    cu = torch.tensor([0, 2, 3], dtype=torch.int32)
    q = c.q.flatten(0, 1)[:3]
    call = functools.partial(flash4.flash_attn_with_kvcache, q, c.k_cache, c.v_cache, cache_seqlens=c.cache_seqlens,
                             block_table=c.block_table)
    with pytest.raises(ValueError, match=r"cu_seqlens_q is set but max_seqlen_q is not"):
        call(cu_seqlens_q=cu)
    with pytest.raises(ValueError, match=r"max_seqlen_q is set but cu_seqlens_q is not"):
        flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, max_seqlen_q=2)
    with pytest.raises(ValueError, match=r"with cu_seqlens_q, q must have 3 dimensions"):
        flash4.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, cu_seqlens_q=cu, max_seqlen_q=2)
    with pytest.raises(ValueError, match=r"k and v \(an append\) are set with cu_seqlens_q"):
        call(c.k, c.v, cu_seqlens_q=cu, max_seqlen_q=2)
    with pytest.raises(ValueError, match=r"segment 0 of cu_seqlens_q has 2 tokens but max_seqlen_q = 1"):
        call(cu_seqlens_q=cu, max_seqlen_q=1)
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be non-decreasing"):
        call(cu_seqlens_q=torch.tensor([0, 2, 1], dtype=torch.int32), max_seqlen_q=2)
    with pytest.raises(TypeError, match=r"cu_seqlens_q.dtype is fp32 but must be int32"):
        call(cu_seqlens_q=cu.float(), max_seqlen_q=2)
    assert torch.equal(call(cu_seqlens_q=cu.long(), max_seqlen_q=2), call(cu_seqlens_q=cu, max_seqlen_q=2))


def test_kvcache_packed_queries_compile_and_opcheck():
    from flash4 import _torch_kvcache

    counts = [2, 1]
    c = Case(2, 2, 4, 2, [20, 7], page_size=16, seed=14)
    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    q = torch.cat([c.q[0, :2], c.q[1, :1]])
    cu = torch.tensor([0, 2, 3], dtype=torch.int32)

    def step(q, k_cache, v_cache, lengths, table, cu):
        return flash4.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table,
                                             cu_seqlens_q=cu, max_seqlen_q=2, return_softmax_lse=True)

    out, lse = torch.compile(step, fullgraph=True)(q, c.k_cache, c.v_cache, c.cache_seqlens, c.block_table, cu)
    _check_mixed(c, counts, out, lse)
    args = (q, c.k_cache, c.v_cache, None, None, None, None, c.cache_seqlens, -1, None, c.block_table, None, None,
            1.0 / math.sqrt(64), True, -1, -1, 0.0, True, 0, cu, 2)
    torch.library.opcheck(_torch_kvcache.fwd_kvcache, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
def test_kvcache_packed_queries_clamp_malformed_device_offsets():
    # Device-resident offsets are not read on the host: segments longer than max_seqlen_q, decreasing or past q
    # are clamped by the kernels; nothing raises or reads out of range, and every output is finite.
    c = Case(3, 4, 4, 2, [17, 40, 9], page_size=16, dtype=torch.float16, seed=10)
    q = c.q.flatten(0, 1)[:10].cuda()
    cu = torch.tensor([0, 7, 3, 99], dtype=torch.int32, device="cuda")
    out, lse = flash4.flash_attn_with_kvcache(q, c.k_cache.cuda(), c.v_cache.cuda(),
                                              cache_seqlens=c.cache_seqlens.cuda(), block_table=c.block_table.cuda(),
                                              causal=True, return_softmax_lse=True, cu_seqlens_q=cu, max_seqlen_q=4)
    torch.cuda.synchronize()
    assert out.shape == (10, 4, 64) and lse.shape == (4, 10)
    assert torch.isfinite(out).all()


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
def test_kvcache_check_offsets_env_on_cuda_tensors(monkeypatch):
    # FLASH4_CHECK_OFFSETS=1 reads the device-resident indices on the host before the CUDA call: a well-formed
    # call runs as without it (same output bit for bit), a page number past the pool is refused by name and nothing
    # is written to the cache.
    c = Case(3, 2, 4, 2, [20, 7, 45], seqlen_new=1, page_size=16, dtype=torch.float16, causal=True, seed=21)
    cuda = {name: getattr(c, name).cuda() for name in ("q", "k", "v", "k_cache", "v_cache", "cache_seqlens",
                                                       "block_table")}

    def call(table, k_cache, v_cache):
        return flash4.flash_attn_with_kvcache(cuda["q"], k_cache, v_cache, cuda["k"], cuda["v"],
                                             cache_seqlens=cuda["cache_seqlens"], block_table=table, causal=True,
                                             return_softmax_lse=True)

    plain = call(cuda["block_table"], cuda["k_cache"].clone(), cuda["v_cache"].clone())
    monkeypatch.setenv("FLASH4_CHECK_OFFSETS", "1")
    checked = call(cuda["block_table"], cuda["k_cache"].clone(), cuda["v_cache"].clone())
    assert all(torch.equal(a, b) for a, b in zip(plain, checked))
    bad = cuda["block_table"].clone()
    bad[2, 1] = c.k_cache.shape[0]
    k_cache, v_cache = cuda["k_cache"].clone(), cuda["v_cache"].clone()
    with pytest.raises(ValueError, match=r"block_table\[2\]\[1\] = .* but must be in \[0, "):
        call(bad, k_cache, v_cache)
    assert torch.equal(k_cache, cuda["k_cache"]) and torch.equal(v_cache, cuda["v_cache"])


def test_varlen_with_block_table_uniform_total_but_not_uniform_segments():
    # total_q = batch * max_seqlen_q, yet the segments are 2 and 1 queries and the last row lies in no sequence:
    # CPU offsets are compared exactly, so this batch is not run as the uniform (batch, 2) view.
    c = Case(2, 2, 4, 4, [9, 33], page_size=16, causal=True, seed=8)
    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    out, lse = _mixed_paged_varlen(c, [2, 1], extra_rows=1)
    assert out.shape[0] == 4
    _check_mixed(c, [2, 1], out, lse)


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
def test_varlen_with_block_table_uniform_total_with_cuda_offsets():
    # The same batch with its offsets on the GPU, where the host does not read them: the packed call reads them on
    # the device (the (batch, 2) view would give sequence 1 rows 2 and 3, and the row in no sequence a result).
    c = Case(2, 2, 4, 4, [9, 33], page_size=16, dtype=torch.float16, causal=True, seed=8)
    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    cuda = copy.copy(c)
    for name in ("q", "k_cache", "v_cache", "cache_seqlens", "block_table"):
        setattr(cuda, name, getattr(c, name).cuda())
    out, lse = _mixed_paged_varlen(cuda, [2, 1], extra_rows=1)
    assert out.shape[0] == 4
    _check_mixed(c, [2, 1], out.cpu(), lse.cpu())


def test_varlen_with_block_table_refusals(monkeypatch):
    c = Case(2, 2, 4, 2, [17, 40], page_size=16)
    with pytest.raises(ValueError, match=r"segment 1 of cu_seqlens_q has 3 tokens but max_seqlen_q = 2"):
        _mixed_paged_varlen(c, [1, 3], 0, max_seqlen_q=2)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[2\] = 5 exceeds q.shape\[0\] \(total_q\) = 4"):
        _paged_varlen(c, 2, max_seqlen_q=3, cu_seqlens_q=torch.tensor([0, 2, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"non-decreasing, but cu_seqlens_q\[2\] = 1 < cu_seqlens_q\[1\] = 3"):
        _paged_varlen(c, 2, max_seqlen_q=3, cu_seqlens_q=torch.tensor([0, 3, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[0\] = 1 but must be 0"):
        _paged_varlen(c, 2, max_seqlen_q=3, cu_seqlens_q=torch.tensor([1, 2, 3], dtype=torch.int32))
    with pytest.raises(TypeError, match="takes torch tensors; cu_seqlens_q is builtins.list"):
        _paged_varlen(c, 2, cu_seqlens_q=[0, 2, 4])
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 65 exceeds .* cache_seqlens = seqused_k\)"):
        _paged_varlen(c, 2, cu_seqlens_k=None, seqused_k=torch.tensor([17, 65], dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="seqused_q"):
        _paged_varlen(c, 2, seqused_q=torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="forward only"):
        c.q.requires_grad_(True)
        _paged_varlen(c, 2)
    c.q.requires_grad_(False)
    with torch.no_grad():
        c.q.requires_grad_(True)
        _paged_varlen(c, 2)  # no graph is built: runs
    c.q = c.q.detach()
    with pytest.raises(ValueError, match=r"block_table must be \(batch, max_pages\) = \(2, max_pages\)"):
        _paged_varlen(c, 2, block_table=c.block_table[:1])
    with pytest.raises(ValueError, match="cu_seqlens_k or seqused_k"):
        _paged_varlen(c, 2, cu_seqlens_k=None)
    monkeypatch.setenv("FLASH4_CHECK_OFFSETS", "1")
    _paged_varlen(c, 2)  # valid offsets pass the host check
    with pytest.raises(ValueError, match="segment 1 of cu_seqlens_q has 3 tokens but max_seqlen_q = 2"):
        _paged_varlen(c, 2, cu_seqlens_q=torch.tensor([0, 1, 4], dtype=torch.int32))
    # The host check of the queries' offsets where no cu_seqlens_k is given (as for CUDA offsets, which the call
    # itself does not read on the host).
    from flash4._paged_varlen import _check_offsets

    with pytest.raises(ValueError, match=r"non-decreasing, but cu_seqlens_q\[2\] = 1 < cu_seqlens_q\[1\] = 3"):
        _check_offsets(c.q.flatten(0, 1), c.k_cache, torch.tensor([0, 3, 1], dtype=torch.int32), None, 3, 40,
                       c.cache_seqlens, c.block_table)
    with pytest.raises(ValueError, match=r"keys must be in \[0, 64\]"):
        _paged_varlen(c, 2, cu_seqlens_k=None, seqused_k=torch.tensor([17, 65], dtype=torch.int32))


@pytest.mark.parametrize("rotary, seqlen_new", [(None, 0), (None, 2), ("neox", 2), ("interleaved", 3)])
def test_cache_leftpad(rotary, seqlen_new):
    # flash-attn's left padding: sequence b's keys are rows cache_leftpad[b] .. cache_seqlens[b] - 1 of its cache
    # row, then the appended ones; rotary angles are taken at the rows (the padding counts, as in flash-attn).
    c = Case(3, 2, 4, 2, [40, 7, 300], seqlen_new=seqlen_new, dtype=torch.float16, rotary=rotary, causal=True,
             cache_batch_idx=True, sink=True, leftpad=[5, 0, 299], seed=3)
    c.check(*c.run())
    c = Case(2, 1, 4, 4, [9, 64], dtype=torch.float32, window=(3, 0), leftpad=[2, 60], seed=4)
    c.check(*c.run())


def test_cache_leftpad_refusals():
    c = Case(2, 1, 4, 2, [17, 40], page_size=16)
    with pytest.raises(ValueError, match="cache_leftpad is set with block_table"):
        c.run(cache_leftpad=torch.tensor([1, 2], dtype=torch.int32))
    c = Case(2, 1, 4, 2, [17, 40])
    with pytest.raises(ValueError, match=r"cache_leftpad\[1\] = 41 but must be in \[0, 40\]"):
        c.run(cache_leftpad=torch.tensor([1, 41], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_leftpad"):
        c.run(cache_leftpad=torch.tensor([1, 2, 3], dtype=torch.int32))

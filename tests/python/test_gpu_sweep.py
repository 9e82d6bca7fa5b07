"""A randomized sweep of the GPU paths on shapes no other test lists: flash_attn_func (forward and backward),
flash_attn_varlen_func and flash_attn_with_kvcache, each case drawn from a seeded generator (head dims every
multiple of 8 up to 256 and the (192, 128) / (128, 64) splits, GQA ratios 1-8, 16 and 32, odd lengths, causal, window,
softcap, the learnable sink, deterministic mode, paged and contiguous caches, appends, split counts) and judged
against the float64 reference with the tolerance rule of attention_reference.py.

On a Hopper GPU: FLASH4_SWEEP_CASES cases per entry point (default 12), seed FLASH4_SWEEP_SEED (default: from the
clock, so every run draws new shapes); a failure names the seed and the case, so it can be replayed. On the CPU
(everywhere, so the sweep itself cannot rot where no GPU runs it): FLASH4_SWEEP_CPU_CASES cases (default 3) of
a fixed seed (FLASH4_SWEEP_SEED if set)."""

import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flash4  # noqa: E402
from attention_reference import check_tolerance  # noqa: E402
from test_kvcache import Case as KvCase  # noqa: E402
from test_kvcache import _check_mixed, _mixed_paged_varlen, _packed_kvcache  # noqa: E402
from test_varlen import DTYPE_NAMES, VarlenCase, hopper_present, numpy64  # noqa: E402
from torch_reference import attention, stored_output_delta  # noqa: E402

CASES = {"cuda": int(os.environ.get("FLASH4_SWEEP_CASES", "12")),
         "cpu": int(os.environ.get("FLASH4_SWEEP_CPU_CASES", "3"))}
SEEDS = {"cuda": int(os.environ.get("FLASH4_SWEEP_SEED", str(int(time.time())))),
         "cpu": int(os.environ.get("FLASH4_SWEEP_SEED", "20261203"))}
SWEEP = [pytest.param("cpu", case, id=f"cpu-{case}") for case in range(CASES["cpu"])] + [
    pytest.param("cuda", case, id=f"cuda-{case}",
                 marks=pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU"))
    for case in range(CASES["cuda"])]


def head_dims(rng):
    """(d, d_v): mostly the kernels' widths, often any multiple of 8, sometimes a split."""
    pick = rng.random()
    if pick < 0.45:
        d = int(rng.choice([64, 96, 128, 192, 256]))
        return d, d
    if pick < 0.85:
        d = 8 * int(rng.integers(1, 33))
        return d, d
    return [(192, 128), (128, 64)][int(rng.integers(0, 2))]


def masks(rng):
    """causal, window, softcap."""
    causal = bool(rng.random() < 0.4)
    window = (-1, -1)
    if rng.random() < 0.25:
        window = (int(rng.integers(0, 300)), int(rng.integers(-1, 50)) if not causal else 0)
    softcap = float(rng.choice([0.0, 0.0, 0.0, 5.0, 30.0]))
    return causal, window, softcap


def groups(rng):
    """(heads, heads_kv): the models' GQA ratios (Qwen's 5 and 7 among them), sometimes one KV head for 16-32."""
    if rng.random() < 0.1:
        return int(rng.choice([16, 32])), 1
    heads_kv = int(rng.integers(1, 4))
    return heads_kv * int(rng.choice([1, 1, 2, 3, 4, 5, 6, 7, 8])), heads_kv


def lengths(rng, high):
    """An odd mix: mostly uniform in [1, high], sometimes tile edges or 0 / 1."""
    r = rng.random()
    if r < 0.15:
        return int(rng.choice([0, 1, 2]))
    if r < 0.3:
        return int(rng.choice([63, 64, 65, 127, 128, 129, 191, 193, 255, 257]))
    return int(rng.integers(1, high + 1))


def run_or_skip(fn, what):
    try:
        return fn()
    except NotImplementedError as e:
        pytest.skip(f"{what}: not implemented on this GPU by flash4: {e}")


def dense_case(rng, case, device, seed):
    d, dv = head_dims(rng)
    heads, heads_kv = groups(rng)
    causal, window, softcap = masks(rng)
    batch = int(rng.integers(1, 4))
    sq = max(lengths(rng, 700), 1)
    sk = sq if rng.random() < 0.6 else max(lengths(rng, 900), 1)
    dtype = [torch.bfloat16, torch.float16][int(rng.integers(0, 2))]
    sink = bool(rng.random() < 0.2)
    deterministic = bool(rng.random() < 0.3)
    what = (f"{device} seed {seed} dense case {case}: b{batch} sq{sq} sk{sk} h{heads}/{heads_kv} d{d}/{dv} "
            f"{DTYPE_NAMES[dtype]} causal={causal} window={window} softcap={softcap} sink={sink} det={deterministic}")
    gen = torch.Generator().manual_seed(seed * 1000 + case)

    def make(*size, dt=dtype):
        return torch.randn(*size, generator=gen, dtype=torch.float64).to(device=device, dtype=dt)

    q, k, v = make(batch, sq, heads, d), make(batch, sk, heads_kv, d), make(batch, sk, heads_kv, dv)
    dout = make(batch, sq, heads, dv)
    sink_t = make(heads, dt=torch.float32) if sink else None
    scale = d**-0.5

    def run():
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        s = None if sink_t is None else sink_t.clone().requires_grad_(True)
        out, lse = flash4.flash_attn_func(*leaves, causal=causal, window_size=window, softcap=softcap,
                                          deterministic=deterministic, return_lse=True, learnable_sink=s)
        out.backward(dout)
        return out, lse, [t.grad for t in leaves] + ([s.grad] if s is not None else [])

    out, lse, grads = run_or_skip(run, what)
    if deterministic:
        out2, lse2, grads2 = run()
        assert torch.equal(out, out2) and all(torch.equal(a, b) for a, b in zip(grads, grads2)), (
            f"{what}: deterministic mode gave two different results")

    def reference(round_to=None, stored_out=None):
        leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
        s = None if sink_t is None else sink_t.detach().double().requires_grad_(True)
        delta = None if stored_out is None else stored_output_delta(stored_out, dout)
        o, l = attention(*leaves, scale, causal, window, softcap, round_to=round_to, sink=s, delta=delta)
        o.backward(dout.double())
        g = [t.grad for t in leaves] + ([s.grad] if s is not None else [])
        if round_to is not None:
            g = [x.to(round_to).double() for x in g[:3]] + g[3:]
        return o, l, g

    ref_out, ref_lse, ref_grads = reference()
    naive_out, naive_lse, naive_grads = reference(dtype, out)
    name = DTYPE_NAMES[dtype]
    check_tolerance(f"{what}: out", numpy64(out), numpy64(ref_out), numpy64(naive_out), name)
    check_tolerance(f"{what}: lse", numpy64(lse), numpy64(ref_lse), numpy64(naive_lse), "float32", 1e-4)
    for grad_name, g, r, n in zip(("dq", "dk", "dv"), grads, ref_grads, naive_grads):
        check_tolerance(f"{what}: {grad_name}", numpy64(g), numpy64(r), numpy64(n), name)
    if sink:  # dsink: fp32 sums over every row; judged against the reference with a relative bound
        err = float((grads[3].double() - ref_grads[3]).abs().max())
        bound = 2e-2 * max(float(ref_grads[3].abs().max()), 1.0)
        assert err <= bound, f"{what}: dsink error {err:.3g} > {bound:.3g}"


def varlen_case(rng, case, device, seed):
    d, dv = head_dims(rng)
    heads, heads_kv = groups(rng)
    causal, window, softcap = masks(rng)
    n = int(rng.integers(1, 9))
    lens_q = [lengths(rng, 600) for _ in range(n)]
    lens_k = list(lens_q) if rng.random() < 0.5 else [lengths(rng, 800) for _ in range(n)]
    dtype = [torch.bfloat16, torch.float16][int(rng.integers(0, 2))]
    sink = bool(rng.random() < 0.25)
    what = (f"{device} seed {seed} varlen case {case}: lens_q {lens_q} lens_k {lens_k} h{heads}/{heads_kv} "
            f"d{d}/{dv} {DTYPE_NAMES[dtype]} causal={causal} window={window} softcap={softcap} sink={sink}")
    c = VarlenCase(lens_q, lens_k, heads, heads_kv, d, dtype, device, causal=causal, window=window, softcap=softcap,
                   sink=sink, seed=seed * 1000 + case, dim_v=dv)
    try:
        c.check()
    except NotImplementedError as e:
        pytest.skip(f"{what}: not implemented on this GPU by flash4: {e}")
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def kvcache_case(rng, case, device, seed):
    d = int(rng.choice([64, 128, 256, 96, 8 * int(rng.integers(1, 33))]))
    heads, heads_kv = groups(rng)
    batch = int(rng.integers(1, 6))
    seqlen_q = int(rng.choice([1, 1, 1, 2, 4, 7, 16, 40]))
    seqlen_new = int(rng.choice([0, 0, 1, seqlen_q]))
    page_size = int(rng.choice([0, 0, 16, 64, 256]))
    cache_len = [lengths(rng, int(rng.choice([300, 3000, 20000]))) for _ in range(batch)]
    if seqlen_new == 0:  # the check's reference needs a key per sequence (empty caches: test_kvcache.py)
        cache_len = [max(n, 1) for n in cache_len]
    causal, window, softcap = masks(rng)
    if window != (-1, -1) and not causal:
        window = (window[0], max(window[1], 0))
    sink = bool(rng.random() < 0.2)
    splits = int(rng.choice([0, 0, 1, 3, 17]))
    what = (f"{device} seed {seed} kvcache case {case}: b{batch} sq{seqlen_q} new{seqlen_new} lens {cache_len} "
            f"h{heads}/{heads_kv} d{d} page {page_size} causal={causal} window={window} softcap={softcap} "
            f"sink={sink} splits={splits}")
    c = KvCase(batch, seqlen_q, heads, heads_kv, cache_len, seqlen_new=seqlen_new, page_size=page_size,
               dtype=torch.float16, causal=causal, window=window, softcap=softcap, sink=sink, head_dim=d,
               seed=seed * 1000 + case)
    cpu = {name: getattr(c, name) for name in ("q", "k", "v", "k_cache", "v_cache", "cache_seqlens", "block_table",
                                               "cache_batch_idx", "sink")}
    for name, t in cpu.items():
        setattr(c, name, None if t is None else t.to(device))
    try:
        out, lse = c.run(num_splits=splits)
    except NotImplementedError as e:
        pytest.skip(f"{what}: not implemented on this GPU by flash4: {e}")
    for name, t in cpu.items():  # the check reads the caches after the append, on the CPU
        setattr(c, name, None if t is None else getattr(c, name).cpu())
    c.k_cache_in, c.v_cache_in = c.k_cache_in.cpu(), c.v_cache_in.cpu()
    try:
        c.check(out.cpu(), lse.cpu())
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def run_mixed_counts(c, counts, extra_rows, call, device, what):
    """call(c, counts, extra_rows) on `device` (c's tensors moved there for the call), each sequence's rows checked
    against the fp64 model on the host (_check_mixed)."""
    c.k_cache_in, c.v_cache_in = c.k_cache.clone(), c.v_cache.clone()
    names = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table", "cache_batch_idx", "sink")
    cpu = {name: getattr(c, name) for name in names}
    for name, t in cpu.items():
        setattr(c, name, None if t is None else t.to(device))
    try:
        out, lse = call(c, counts, extra_rows)
    except NotImplementedError as e:
        pytest.skip(f"{what}: not implemented on this GPU by flash4: {e}")
    for name, t in cpu.items():
        setattr(c, name, t)
    try:
        _check_mixed(c, counts, out.cpu(), lse.cpu())
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def paged_varlen_case(rng, case, device, seed):
    """flash_attn_varlen_func with block_table: a serving engine's step, decode sequences (1 query, or a few
    speculative ones) beside prefill chunks, or all alike (the uniform, synchronisation-free path)."""
    d = int(rng.choice([64, 128, 8 * int(rng.integers(1, 33))]))
    heads, heads_kv = groups(rng)
    batch = int(rng.integers(1, 7))
    alike = bool(rng.random() < 0.3)
    counts = [int(rng.choice([1, 1, 1, 3, 16, 40, 200])) for _ in range(1 if alike else batch)]
    counts = counts * batch if alike else counts
    cache_len = [max(lengths(rng, int(rng.choice([300, 3000]))), n) for n in counts]
    page_size = int(rng.choice([1, 16, 64, 256]))
    window = (int(rng.integers(0, 300)), 0) if rng.random() < 0.25 else (-1, -1)
    sink = bool(rng.random() < 0.2)
    extra_rows = int(rng.choice([0, 0, 3]))
    what = (f"{device} seed {seed} paged varlen case {case}: counts {counts} (+{extra_rows} rows) lens {cache_len} "
            f"h{heads}/{heads_kv} d{d} page {page_size} window={window} sink={sink}")
    c = KvCase(batch, max(counts), heads, heads_kv, cache_len, page_size=page_size, dtype=torch.float16,
               causal=True, window=window, sink=sink, head_dim=d, seed=seed * 1000 + case)
    run_mixed_counts(c, counts, extra_rows, _mixed_paged_varlen, device, what)


def packed_kvcache_case(rng, case, device, seed):
    """flash_attn_with_kvcache with packed queries (cu_seqlens_q): decode and speculative counts, an empty
    sequence now and then, sometimes a chunk longer than the 16-query tile; contiguous caches (shuffled rows) or
    pages; masks, GQA, the sink."""
    d = int(rng.choice([64, 128, 8 * int(rng.integers(1, 33))]))
    heads, heads_kv = groups(rng)
    batch = int(rng.integers(1, 7))
    counts = [int(rng.choice([0, 1, 1, 2, 4, 16, 33])) for _ in range(batch)]
    if not any(counts):
        counts[0] = 1  # at least one query in the batch
    cache_len = [max(lengths(rng, int(rng.choice([300, 3000]))), n) for n in counts]
    page_size = int(rng.choice([0, 16, 64, 256]))
    window = (int(rng.integers(0, 300)), 0) if rng.random() < 0.25 else (-1, -1)
    sink = bool(rng.random() < 0.2)
    extra_rows = int(rng.choice([0, 0, 2]))
    what = (f"{device} seed {seed} packed kvcache case {case}: counts {counts} (+{extra_rows} rows) lens {cache_len} "
            f"h{heads}/{heads_kv} d{d} page {page_size} window={window} sink={sink}")
    c = KvCase(batch, max(counts), heads, heads_kv, cache_len, page_size=page_size, dtype=torch.float16,
               causal=True, window=window, sink=sink, head_dim=d, cache_batch_idx=page_size == 0,
               seed=seed * 1000 + case)
    run_mixed_counts(c, counts, extra_rows, _packed_kvcache, device, what)


@pytest.mark.parametrize("device,case", SWEEP)
def test_dense(device, case):
    dense_case(np.random.default_rng([SEEDS[device], 1, case]), case, device, SEEDS[device])


@pytest.mark.parametrize("device,case", SWEEP)
def test_varlen(device, case):
    varlen_case(np.random.default_rng([SEEDS[device], 2, case]), case, device, SEEDS[device])


@pytest.mark.parametrize("device,case", SWEEP)
def test_kvcache(device, case):
    kvcache_case(np.random.default_rng([SEEDS[device], 3, case]), case, device, SEEDS[device])


@pytest.mark.parametrize("device,case", SWEEP)
def test_paged_varlen(device, case):
    paged_varlen_case(np.random.default_rng([SEEDS[device], 4, case]), case, device, SEEDS[device])


@pytest.mark.parametrize("device,case", SWEEP)
def test_packed_kvcache(device, case):
    packed_kvcache_case(np.random.default_rng([SEEDS[device], 5, case]), case, device, SEEDS[device])


def test_the_sweep_draws_every_kind():
    """The generators reach the shapes they are meant to (a sweep that never draws a split or GQA tests less)."""
    rng = np.random.default_rng(SEEDS["cpu"])
    dims = {head_dims(rng) for _ in range(400)}
    assert (192, 128) in dims and (128, 64) in dims and any(d % 64 for d, _ in dims)
    ratios = {h // hkv for h, hkv in (groups(rng) for _ in range(400))}
    assert {1, 5, 7, 8, 16, 32} <= ratios
    assert any(masks(rng)[0] for _ in range(50)) and any(masks(rng)[1] != (-1, -1) for _ in range(50))

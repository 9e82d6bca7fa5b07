"""The FP8 forward from Python: flash_attn_func / flash_attn_varlen_func on torch.float8_e4m3fn q, k, v with
q/k/v_descale (FlashAttention 3's interface), out bf16. Judged against the float64 reference of the dequantized
inputs (FP8 value * descale) with the tolerance rule, the naive FP8 attention as its baseline (docs/numerics.md,
"FP8 forward"); also bit equality with the fp32 path on the dequantized values, a misplaced descale caught by the
rule, torch.compile, fp16 out through flash4.forward, forward-only refusals and argument errors. CPU, and the
Hopper kernel (dense batches, head dims 128 and 256)."""

import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flash4  # noqa: E402
from torch_devices import hopper_present  # noqa: E402
from attention_reference import allowed_keys, check_tolerance  # noqa: E402
from torch_reference import attention, numpy64  # noqa: E402

FP8 = torch.float8_e4m3fn


def quantized(gen, *shape):
    """FP8 values of N(0, 4^2) inputs, as a per-tensor scale would leave them (E4M3 holds up to 448)."""
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * 4.0).to(torch.float32).to(FP8)


def descale(gen, batch, heads_kv):
    """Factors far from 1 and different per (batch entry, kv head), so that a dropped or misplaced one shows."""
    return torch.exp2(torch.rand(batch, heads_kv, generator=gen, dtype=torch.float64) * 2.0 - 3.0).float()


def dequantized(x, factor, heads_kv, entries=None):
    """x (batch, seqlen, heads, d) or packed (total, heads, d) in float64, head h scaled by factor[b, h // group];
    entries: each packed row's batch entry."""
    if factor is None:
        return x.double()
    group = x.shape[-2] // heads_kv
    per_head = factor.double().repeat_interleave(group, dim=1)  # (batch, heads)
    if entries is None:
        return x.double() * per_head[:, None, :, None]
    return x.double() * per_head[entries][:, :, None]


def naive_fp8_attention(q, k, v, scale, causal, window, softcap, out_dtype):
    """The baseline: fp32 scores, the unnormalized P~ = exp(S - rowmax) rounded to E4M3 for P~ V, the denominator
    summed before that rounding, O rounded to out_dtype and the LSE to fp32 (src/check/naive_fp8_attention.h).
    Dense, dequantized float64 inputs."""
    group = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk).float().double()
    s = (s * scale).float().double()
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    ok = torch.from_numpy(allowed_keys(q.shape[1], k.shape[1], causal, window))
    s = s.masked_fill(~ok, float("-inf"))
    m = s.amax(dim=-1, keepdim=True) if s.shape[-1] else s.new_full(s.shape[:-1] + (1,), float("-inf"))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    numerator = torch.exp(s - m)
    total = numerator.sum(dim=-1)
    p_fp8 = numerator.float().to(FP8).double()
    out = torch.einsum("bhqk,bkhd->bqhd", p_fp8, vv)
    denominator = total.transpose(1, 2)[..., None]  # (batch, seqlen_q, heads, 1)
    out = torch.where(denominator > 0, out / denominator.clamp_min(1e-300), torch.zeros_like(out))
    lse = torch.where(total > 0, m[..., 0] + torch.log(total), torch.full_like(total, float("-inf")))
    return out.to(out_dtype).double(), lse.float().double()


def _truncated(x, largest, fraction_bits):
    """x truncated toward zero to `fraction_bits` bits below the exponent of `largest` (broadcast)."""
    quantum = torch.ldexp(torch.ones_like(largest), torch.frexp(largest).exponent - 1 - fraction_bits)
    return torch.trunc(x / quantum) * quantum


def _k_step(acc, terms, fraction_bits=13):
    """acc + terms.sum(-1) as Hopper's FP8 tensor cores form one k-step: every addend truncated toward zero to
    `fraction_bits` bits below the largest exponent among them, summed (exactly, in float64), the sum truncated to
    as many bits below its own leading one, held in fp32 (src/check/naive_fp8_attention.h,
    Fp8Arithmetic::hopper_tensor_cores)."""
    largest = torch.maximum(acc.abs(), terms.abs().amax(-1))
    total = _truncated(acc, largest, fraction_bits) + _truncated(terms, largest[..., None], fraction_bits).sum(-1)
    return _truncated(total, total.abs(), fraction_bits).float().double()


def naive_fp8_tensor_cores(q, k, v, descales, scale, causal, window, softcap, out_dtype, tile_keys=128):
    """The baseline of the GPU kernel (the C++ tests' Fp8Arithmetic::hopper_tensor_cores): the FP8 values
    themselves multiplied in k-steps of 32 (_k_step) with the descales applied after the matmuls, and P~ taken
    against the online softmax's reference max over 128-key tiles, walked from the last, that moves only when a
    tile's max exceeds it by more than 2^8 (FA4's conditional rescaling). q, k, v: the FP8 values, dense, float64."""
    batch, seqlen_q, heads, dim = q.shape
    seqlen_k, heads_kv, dim_v = k.shape[1], k.shape[2], v.shape[3]
    group = heads // heads_kv

    def per_head(d):
        ones = torch.ones(batch, heads_kv, dtype=torch.float32)
        return (ones if d is None else d.float()).repeat_interleave(group, dim=1).double()[:, :, None, None]

    qd, kd, vd = (per_head(d) for d in descales)
    qq = q.permute(0, 2, 1, 3)  # (batch, heads, seqlen_q, dim)
    kk = k.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
    vv = v.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
    acc = torch.zeros(batch, heads, seqlen_q, seqlen_k, dtype=torch.float64)
    for x in range(0, dim, 32):
        acc = _k_step(acc, qq[:, :, :, None, x:x + 32] * kk[:, :, None, :, x:x + 32])
    score_scale = (scale * (qd * kd).float().double()).float().double()
    s = (acc * score_scale).float().double()
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    ok = torch.from_numpy(allowed_keys(seqlen_q, seqlen_k, causal, window))
    s = s.masked_fill(~ok, float("-inf"))
    m = torch.full((batch, heads, seqlen_q), float("-inf"), dtype=torch.float64)
    l = torch.zeros_like(m)
    o = torch.zeros(batch, heads, seqlen_q, dim_v, dtype=torch.float64)
    for t in reversed(range((seqlen_k + tile_keys - 1) // tile_keys)):
        lo, hi = t * tile_keys, min((t + 1) * tile_keys, seqlen_k)
        m_tile = s[..., lo:hi].amax(-1)
        first = torch.isinf(m) & torch.isfinite(m_tile)
        grow = torch.isfinite(m) & ((m_tile - m) * 1.4426950408889634 > 8.0)
        factor = torch.where(grow, torch.exp(m - m_tile).float().double(), torch.ones_like(m))
        o, l = (o * factor[..., None]).float().double(), l * factor
        m = torch.where(first | grow, m_tile, m)
        live = torch.isfinite(m)[..., None]
        numerator = torch.where(live, torch.exp(s[..., lo:hi] - torch.where(live, m[..., None], 0.0)), 0.0)
        l = l + numerator.sum(-1)
        p_fp8 = numerator.float().to(FP8).double()
        for j in range(lo, hi, 32):
            j1 = min(j + 32, hi)
            terms = p_fp8[..., j - lo:j1 - lo, None] * vv[:, :, None, j:j1, :]  # (b, h, q, keys, dim_v)
            o = _k_step(o, terms.transpose(-1, -2))
    out = torch.where(l[..., None] > 0, o * vd / l.clamp_min(1e-300)[..., None], torch.zeros_like(o))
    lse = torch.where(l > 0, m + torch.log(l.clamp_min(1e-300)), torch.full_like(l, float("-inf")))
    return out.permute(0, 2, 1, 3).to(out_dtype).double(), lse.float().double()


class Fp8Case:
    """FP8 inputs (dense, or packed when lens_q / lens_k are given) with descales, the reference's and the naive
    baseline's results."""

    def __init__(self, batch, seqlen_q, seqlen_k, heads, heads_kv, dim, dim_v=None, causal=False, window=(-1, -1),
                 softcap=0.0, with_descale=True, lens_q=None, lens_k=None):
        self.causal, self.window, self.softcap = causal, window, softcap
        self.heads_kv, self.lens_q, self.lens_k = heads_kv, lens_q, lens_k
        self.scale = dim**-0.5
        dim_v = dim if dim_v is None else dim_v
        gen = torch.Generator().manual_seed(zlib.crc32(repr(vars(self)).encode()) + seqlen_q * heads)
        if lens_q is not None:
            batch = len(lens_q)
            self.q = quantized(gen, sum(lens_q), heads, dim)
            self.k = quantized(gen, sum(lens_k), heads_kv, dim)
            self.v = quantized(gen, sum(lens_k), heads_kv, dim_v)
            self.cu_q, self.cu_k = (torch.tensor([0] + np.cumsum(n).tolist(), dtype=torch.int32)
                                    for n in (lens_q, lens_k))
        else:
            self.q = quantized(gen, batch, seqlen_q, heads, dim)
            self.k = quantized(gen, batch, seqlen_k, heads_kv, dim)
            self.v = quantized(gen, batch, seqlen_k, heads_kv, dim_v)
        self.descales = tuple(descale(gen, batch, heads_kv) if with_descale else None for _ in range(3))

    def options(self):
        return dict(causal=self.causal, window_size=self.window, softcap=self.softcap)

    def run_flash4(self, descales=None, **extra):
        qd, kd, vd = self.descales if descales is None else descales
        kwargs = dict(q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True, **self.options(), **extra)
        if self.lens_q is None:
            return flash4.flash_attn_func(self.q, self.k, self.v, **kwargs)
        return flash4.flash_attn_varlen_func(self.q, self.k, self.v, self.cu_q, self.cu_k, max(self.lens_q),
                                             max(self.lens_k), **kwargs)

    def real_inputs(self):
        """The dequantized q, k, v in float64 (packed: each row scaled by its sequence's factors)."""
        entries = [None] * 2
        if self.lens_q is not None:
            entries = [torch.repeat_interleave(torch.arange(len(n)), torch.tensor(n))
                       for n in (self.lens_q, self.lens_k)]
        return (dequantized(self.q, self.descales[0], self.heads_kv, entries[0]),
                dequantized(self.k, self.descales[1], self.heads_kv, entries[1]),
                dequantized(self.v, self.descales[2], self.heads_kv, entries[1]))

    def expected(self, out_dtype=torch.bfloat16, tensor_cores=False):
        """(reference out, lse), (naive out, lse), dense or per sequence; tensor_cores: the GPU kernel's baseline
        (naive_fp8_tensor_cores, dense only)."""
        q, k, v = self.real_inputs()
        mask = (self.causal, self.window, self.softcap)
        if tensor_cores:
            assert self.lens_q is None, "the GPU FP8 forward takes dense batches"
            naive = naive_fp8_tensor_cores(self.q.double(), self.k.double(), self.v.double(), self.descales,
                                           self.scale, *mask, out_dtype)
            return attention(q, k, v, self.scale, *mask), naive
        if self.lens_q is None:
            return attention(q, k, v, self.scale, *mask), naive_fp8_attention(q, k, v, self.scale, *mask, out_dtype)
        ref, naive = ([], []), ([], [])
        for b in range(len(self.lens_q)):
            rows_q, rows_k = (slice(int(cu[b]), int(cu[b + 1])) for cu in (self.cu_q, self.cu_k))
            one = (q[None, rows_q], k[None, rows_k], v[None, rows_k])
            for results, (out, lse) in ((ref, attention(*one, self.scale, *mask)),
                                        (naive, naive_fp8_attention(*one, self.scale, *mask, out_dtype))):
                results[0].append(out[0])
                results[1].append(lse[0])
        return tuple((torch.cat(outs, 0), torch.cat(lses, 1)) for outs, lses in (ref, naive))

    def check(self, out, lse, out_dtype_name="bfloat16", tensor_cores=False):
        (ref_out, ref_lse), (naive_out, naive_lse) = self.expected(getattr(torch, out_dtype_name), tensor_cores)
        assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
        check_tolerance("out", numpy64(out), numpy64(ref_out), numpy64(naive_out), out_dtype_name)
        check_tolerance("lse", numpy64(lse), numpy64(ref_lse), numpy64(naive_lse), "float32")


CASES = {
    "gqa3-odd": dict(batch=2, seqlen_q=17, seqlen_k=33, heads=6, heads_kv=2, dim=64),
    "one": dict(batch=1, seqlen_q=1, seqlen_k=1, heads=1, heads_kv=1, dim=64),
    "mqa-causal-masked-rows": dict(batch=3, seqlen_q=40, seqlen_k=29, heads=4, heads_kv=1, dim=40, causal=True),
    "window": dict(batch=1, seqlen_q=65, seqlen_k=130, heads=8, heads_kv=4, dim=128, window=(32, 0)),
    "softcap-causal": dict(batch=2, seqlen_q=24, seqlen_k=24, heads=4, heads_kv=2, dim=32, causal=True, softcap=5.0),
    "head-dim-v": dict(batch=2, seqlen_q=19, seqlen_k=23, heads=4, heads_kv=2, dim=64, dim_v=32),
    "d256": dict(batch=1, seqlen_q=9, seqlen_k=300, heads=2, heads_kv=1, dim=256),
    "no-descale": dict(batch=2, seqlen_q=31, seqlen_k=31, heads=4, heads_kv=2, dim=64, with_descale=False),
    "varlen-gqa": dict(batch=0, seqlen_q=0, seqlen_k=0, heads=4, heads_kv=2, dim=64, lens_q=[5, 0, 17, 1],
                       lens_k=[9, 3, 17, 0], causal=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fp8_forward_matches_reference(case):
    c = Fp8Case(**CASES[case])
    out, lse = c.run_flash4()
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    c.check(out, lse)


@pytest.mark.parametrize("case", ["gqa3-odd", "mqa-causal-masked-rows", "varlen-gqa"])
def test_fp8_equals_fp32_path_on_dequantized_values(case):
    """The CPU dequantizes (one fp32 product per element) and runs the fp32 algorithm: the same bits as the fp32
    path on those products, rounded to bf16."""
    c = Fp8Case(**CASES[case])
    out, lse = c.run_flash4()
    q, k, v = (x.float() for x in c.real_inputs())  # fp8 value * fp32 factor: exact in float64, rounded here
    if c.lens_q is None:
        out32, lse32 = flash4.flash_attn_func(q, k, v, return_lse=True, **c.options())
    else:
        out32, lse32 = flash4.flash_attn_varlen_func(q, k, v, c.cu_q, c.cu_k, max(c.lens_q), max(c.lens_k),
                                                     return_lse=True, **c.options())
    assert torch.equal(out, out32.to(torch.bfloat16)) and torch.equal(lse, lse32)


def test_rule_catches_misplaced_or_dropped_descales():
    c = Fp8Case(**CASES["gqa3-odd"])
    qd, kd, vd = c.descales
    wrong = {"kv heads swapped": (qd, kd.flip(1), vd), "q_descale dropped": (None, kd, vd),
             "v_descale of another entry": (qd, kd, vd.flip(0))}
    for what, descales in wrong.items():
        out, lse = c.run_flash4(descales=descales)
        with pytest.raises(AssertionError, match="max error"):
            c.check(out, lse)
            raise RuntimeError(f"the tolerance rule accepted FP8 results with {what}")


def test_fp16_out_through_forward():
    c = Fp8Case(**CASES["gqa3-odd"])
    out = torch.empty(c.q.shape, dtype=torch.float16)
    lse = torch.empty(c.q.shape[0], c.q.shape[2], c.q.shape[1])
    qd, kd, vd = c.descales
    flash4.forward(c.q, c.k, c.v, out, lse, q_descale=qd, k_descale=kd, v_descale=vd)
    c.check(out, lse, "float16")


def test_compile_fullgraph():
    c = Fp8Case(**CASES["softcap-causal"])

    def f(q, k, v, qd, kd, vd):
        return flash4.flash_attn_func(q, k, v, causal=True, softcap=5.0, q_descale=qd, k_descale=kd, v_descale=vd)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)  # fullgraph: any graph break is an error
    assert torch.equal(compiled(c.q, c.k, c.v, *c.descales), f(c.q, c.k, c.v, *c.descales))


def test_fake_implementation_and_can_implement():
    c = Fp8Case(**CASES["gqa3-odd"])
    # test_schema is left out: it multiplies the inputs, which torch does not implement for float8_e4m3fn.
    torch.library.opcheck(torch.ops.flash4.fwd_fp8.default, (c.q, c.k, c.v, *c.descales, 0.0, True, -1, -1, 0.0),
                          test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
    assert flash4.can_implement(c.q, c.k, c.v)
    with pytest.raises(TypeError, match="FP8 is forward only"):
        flash4.can_implement(c.q, c.k, c.v, backward=True)


# ---- forward only --------------------------------------------------------------------------------------------


def test_inputs_that_need_gradients_are_refused():
    c = Fp8Case(**CASES["gqa3-odd"])
    qd, kd, vd = c.descales
    with pytest.raises(NotImplementedError, match="forward only, but q requires grad"):
        flash4.flash_attn_func(c.q.clone().requires_grad_(), c.k, c.v, q_descale=qd)
    with pytest.raises(NotImplementedError, match="forward only, but k_descale requires grad"):
        flash4.flash_attn_func(c.q, c.k, c.v, q_descale=qd, k_descale=kd.clone().requires_grad_())
    with torch.no_grad():  # no gradient wanted: runs
        out = flash4.flash_attn_func(c.q, c.k, c.v.clone().requires_grad_(), q_descale=qd, k_descale=kd, v_descale=vd)
    assert not out.requires_grad and torch.equal(out, c.run_flash4()[0])


def test_backward_through_the_op_is_refused():
    c = Fp8Case(**CASES["one"])
    q = c.q.clone().requires_grad_()
    out, _ = torch.ops.flash4.fwd_fp8(q, c.k, c.v, *c.descales, 0.0, False, -1, -1, 0.0)
    with pytest.raises(NotImplementedError, match="fwd_fp8 has no backward"):
        out.float().sum().backward()


# ---- errors --------------------------------------------------------------------------------------------------


def test_bad_fp8_arguments():
    c = Fp8Case(**CASES["gqa3-odd"])  # batch 2, heads_kv 2
    q, k, v = c.q, c.k, c.v
    qd = c.descales[0]
    type_errors = [
        (dict(k=k.to(torch.bfloat16)), r"k.dtype is torch.bfloat16 but q.dtype is torch.float8_e4m3fn"),
        (dict(v=v.float()), r"v.dtype is torch.float32 but q.dtype is torch.float8_e4m3fn"),
        (dict(q=q.to(torch.bfloat16), k=k.to(torch.bfloat16), v=v.to(torch.bfloat16), q_descale=qd),
         r"q_descale is given but q.dtype is torch.bfloat16"),
        (dict(q=q.to(torch.bfloat16)), r"k.dtype is float8_e4m3fn but q.dtype is bf16"),
        (dict(k_descale=qd.double()), r"k_descale has dtype float64"),
        (dict(v_descale=qd.to(torch.bfloat16)), r"v_descale.dtype is bf16 but must be fp32"),
        (dict(q_descale=qd.numpy()), r"q_descale must be a torch.Tensor like q"),
    ]
    value_errors = [
        (dict(q_descale=torch.ones(2, 3)), r"q_descale.shape\[1\] \(heads_kv\) = 3 but expected 2"),
        (dict(k_descale=torch.ones(3, 2)), r"k_descale.shape\[0\] \(batch\) = 3 but expected 2"),
        (dict(v_descale=torch.ones(2)), r"v_descale must have 2 dimensions \(batch, heads_kv\)"),
        (dict(q=q[0]), r"q must have 4 dimensions"),
    ]
    for errors, kind in ((type_errors, TypeError), (value_errors, ValueError)):
        for change, message in errors:
            args = dict(q=q, k=k, v=v)
            args.update(change)
            with pytest.raises(kind, match=message):
                flash4.flash_attn_func(**args)


def test_descales_in_any_strides():
    # A scale expanded to (batch, heads_kv) (stride 0, as vLLM passes them) or a transposed view equals the
    # contiguous descale, as FlashAttention 3 takes any strides.
    c = Fp8Case(**CASES["gqa3-odd"])  # batch 2, heads_kv 2
    q, k, v = c.q, c.k, c.v
    scale = torch.tensor([0.5])
    expected = flash4.flash_attn_func(q, k, v, q_descale=torch.full((2, 2), 0.5), k_descale=c.descales[1])
    out = flash4.flash_attn_func(q, k, v, q_descale=scale.expand(2, 2), k_descale=c.descales[1].t().contiguous().t())
    assert torch.equal(out, expected)


def test_bad_varlen_descale():
    c = Fp8Case(**CASES["varlen-gqa"])  # 4 sequences, heads_kv 2
    with pytest.raises(ValueError, match=r"q_descale.shape\[0\] \(batch\) = 2 but expected 4; .*number of segments"):
        c.run_flash4(descales=(torch.ones(2, 2), None, None))


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
def test_cuda_refuses_fp8_at_head_dims_it_has_no_kernel_for():
    c = Fp8Case(**CASES["gqa3-odd"])  # head dim 64: the GPU's FP8 kernels are 128 and 256
    q, k, v = (t.cuda() for t in (c.q, c.k, c.v))
    assert not flash4.can_implement(q, k, v)
    with pytest.raises(NotImplementedError):
        flash4.flash_attn_func(q, k, v)


GPU_CASES = {
    "d128-gqa-causal": dict(batch=2, seqlen_q=200, seqlen_k=333, heads=4, heads_kv=2, dim=128, causal=True),
    "d256-window": dict(batch=1, seqlen_q=130, seqlen_k=260, heads=2, heads_kv=1, dim=256, window=(40, 7)),
    "d128-softcap": dict(batch=1, seqlen_q=96, seqlen_k=150, heads=4, heads_kv=4, dim=128, softcap=15.0),
    "d128-decode-rows": dict(batch=3, seqlen_q=2, seqlen_k=700, heads=8, heads_kv=1, dim=128),
}


def test_tensor_core_model_drops_bits_below_a_k_steps_thirteen():
    """S = 1 * 1 + 2^-7 * 2^-7: the second product lies 14 bits below the first, so a k-step drops it (as
    tests/cpu/test_fp8.cpp checks of the C++ model). One key: lse = S / 8."""
    q = torch.zeros(1, 1, 1, 64, dtype=torch.float64)
    q[..., 0], q[..., 1] = 1.0, 2.0**-7
    v = torch.zeros_like(q)
    _, lse = naive_fp8_tensor_cores(q, q, v, (None,) * 3, 0.125, False, (-1, -1), 0.0, torch.bfloat16)
    assert lse.item() == 0.125


def test_tensor_core_model_rounds_the_largest_numerator_against_a_lagging_max():
    """Key 128 (the last tile, walked first) scores 0, key 0 scores 3 < 8 ln 2: the reference max stays at 0 and
    key 0's numerator e^3 = 20.09 becomes E4M3's 20 (the fp32 baseline has it at 1, exact)."""
    q = torch.zeros(1, 1, 1, 64, dtype=torch.float64)
    k = torch.zeros(1, 129, 1, 64, dtype=torch.float64)
    v = torch.zeros_like(k)
    q[..., 0], k[0, 0, 0, 0], k[0, 1:128, 0, 0], v[0, 0] = 1.0, 24.0, -448.0, 1.0
    out, _ = naive_fp8_tensor_cores(q, k, v, (None,) * 3, 0.125, False, (-1, -1), 0.0, torch.bfloat16)
    l = 1.0 + np.exp(3.0)
    assert out[0, 0, 0, 0].item() == torch.tensor(20.0 / l).to(torch.bfloat16).item()
    ref, _ = naive_fp8_attention(q, k, v, 0.125, False, (-1, -1), 0.0, torch.bfloat16)
    assert ref[0, 0, 0, 0].item() == torch.tensor(np.exp(3.0) / l).to(torch.bfloat16).item()


def test_tensor_core_baseline_is_no_tighter_than_the_fp32_one():
    """On the GPU cases the tensor-core baseline's errors are at least the fp32 baseline's order (it models
    more rounding, not less) and the rule with it still catches a dropped descale."""
    c = Fp8Case(**GPU_CASES["d128-gqa-causal"])
    (ref_out, ref_lse), (out32, lse32) = c.expected()
    _, (out_tc, lse_tc) = c.expected(tensor_cores=True)
    assert (lse_tc - ref_lse).abs().max() > (lse32 - ref_lse).abs().max()
    assert (out_tc - ref_out).abs().max() > 0.5 * (out32 - ref_out).abs().max()
    wrong, lse = c.run_flash4(descales=(c.descales[0], c.descales[1], None))
    with pytest.raises(AssertionError, match="max error"):
        c.check(wrong, lse, tensor_cores=True)


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_cuda_fp8_matches_reference(case):
    """The Hopper FP8 kernel: the same reference and rule as the CPU cases, the baseline in the tensor cores'
    arithmetic (naive_fp8_tensor_cores)."""
    c = Fp8Case(**GPU_CASES[case])
    host = (c.q, c.k, c.v, c.descales)
    c.q, c.k, c.v = (t.cuda() for t in host[:3])
    c.descales = tuple(d.cuda() for d in host[3])
    assert flash4.can_implement(c.q, c.k, c.v)
    out, lse = c.run_flash4()
    assert out.is_cuda and out.dtype == torch.bfloat16
    c.q, c.k, c.v, c.descales = host  # the reference reads the host copies
    c.check(out.cpu(), lse.cpu(), tensor_cores=True)

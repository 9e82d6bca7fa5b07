"""flash4 with torch tensors: forward and gradients vs PyTorch's SDPA math backend in float64 (CPU, and CUDA on
a Hopper GPU), the nn layer, and errors (layouts: test_layouts.py; torch.compile and opcheck: test_compile.py)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import flash4  # noqa: E402
from torch_devices import hopper_present, CUDA, DEVICES  # noqa: E402
from attention_reference import allowed_keys, check_tolerance  # noqa: E402
from torch_reference import attention, numpy64, stored_output_delta  # noqa: E402

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


# ---- references ------------------------------------------------------------------------------------------


def _mask(seqlen_q, seqlen_k, causal, window, device):
    return torch.from_numpy(allowed_keys(seqlen_q, seqlen_k, causal, window)).to(device)


def _repeat_kv(q, k, v):
    group = q.shape[2] // k.shape[2]
    return k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)


def sdpa_reference(q, k, v, scale, causal, window):
    """PyTorch's math attention (in q's dtype: float64 here) in flash4's layout, with the bottom-right mask."""
    kk, vv = _repeat_kv(q, k, v)
    mask = _mask(q.shape[1], k.shape[1], causal, window, q.device)
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), attn_mask=mask, scale=scale
        )
    return out.transpose(1, 2)


class Case:
    """Inputs of one attention problem on `device` in `dtype`, and flash4's, the reference's and the naive
    baseline's results."""

    def __init__(self, shape, mask, dtype, device, seed=0, dim_v=None):
        batch, seqlen_q, seqlen_k, heads, heads_kv, dim = shape
        dim_v = dim if dim_v is None else dim_v  # v's and out's head dim
        self.causal, self.window, self.softcap = mask
        self.dtype, self.dtype_name = dtype, DTYPE_NAMES[dtype]
        self.scale = dim**-0.5
        gen = torch.Generator().manual_seed(seed)

        def make(*size):
            return torch.randn(*size, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)

        self.q = make(batch, seqlen_q, heads, dim)
        self.k = make(batch, seqlen_k, heads_kv, dim)
        self.v = make(batch, seqlen_k, heads_kv, dim_v)
        self.dout = make(batch, seqlen_q, heads, dim_v)

    def options(self):
        return {"causal": self.causal, "window_size": self.window, "softcap": self.softcap}

    def run_flash4(self, backward, **extra):
        leaves = [t.clone().requires_grad_(backward) for t in (self.q, self.k, self.v)]
        out, lse = flash4.flash_attn_func(*leaves, return_lse=True, **self.options(), **extra)
        if backward:
            out.backward(self.dout)
        return out, lse, [t.grad for t in leaves]

    def run_reference(self, backward):
        leaves = [t.detach().double().requires_grad_(backward) for t in (self.q, self.k, self.v)]
        out, lse = attention(*leaves, self.scale, self.causal, self.window, self.softcap)
        if self.softcap == 0:  # the judge is PyTorch's SDPA math backend; the manual fp64 path gives the LSE
            out = sdpa_reference(*leaves, self.scale, self.causal, self.window)
        if backward:
            out.backward(self.dout.double())
        return out, lse, [t.grad for t in leaves]

    def run_naive(self, backward, stored_out=None):
        """The naive baseline; its backward takes D from stored_out, the output flash4's backward was given."""
        leaves = [t.detach().clone().requires_grad_(backward) for t in (self.q, self.k, self.v)]
        delta = None if stored_out is None else stored_output_delta(stored_out, self.dout)
        out, lse = attention(*(t.double() for t in leaves), self.scale, self.causal, self.window, self.softcap,
                             round_to=self.dtype, delta=delta)
        if backward:
            out.backward(self.dout.double())
        return out, lse, [t.grad for t in leaves]

    def check(self, backward):
        out, lse, grads = self.run_flash4(backward)
        assert out.dtype == self.dtype and out.shape == self.q.shape[:-1] + self.v.shape[-1:]
        assert lse.dtype == torch.float32 and lse.shape == (self.q.shape[0], self.q.shape[2], self.q.shape[1])
        ref_out, ref_lse, ref_grads = self.run_reference(backward)
        naive_out, naive_lse, naive_grads = self.run_naive(backward, out)
        check_tolerance("out", numpy64(out), numpy64(ref_out), numpy64(naive_out), self.dtype_name)
        # On the GPU part of the exps may come from the FMA polynomial (relative error <= 8.8e-5), which can
        # move the LSE by up to that much where one element dominates a row.
        lse_poly_atol = 1e-4 if self.q.is_cuda else 0.0
        check_tolerance("lse", numpy64(lse), numpy64(ref_lse), numpy64(naive_lse), "float32", lse_poly_atol)
        if backward:
            for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref_grads, naive_grads):
                assert g.dtype == self.dtype
                check_tolerance(name, numpy64(g), numpy64(r), numpy64(n), self.dtype_name)


def skip_unless_supported(case, backward):
    if case.q.is_cuda:
        support = flash4.can_implement(case.q, case.k, case.v, backward=backward, **case.options())
        if not support:
            pytest.skip(f"not supported on this GPU by flash4: {support.reason}")


# ---- numerics on the CPU ---------------------------------------------------------------------------------

# (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim)
CPU_SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (2, 17, 17, 4, 4, 64),
    (1, 65, 129, 4, 2, 64),
    (1, 128, 128, 2, 1, 128),
    (2, 40, 40, 2, 2, 256),
    (1, 100, 30, 2, 2, 32),
]
# (causal, window, softcap); masks with a right bound are paired with seqlen_q <= seqlen_k only, so that no
# row is fully masked (SDPA gives NaN there; test_fully_masked_rows covers them).
MASKS = [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (False, (16, 0), 0.0), (False, (-1, -1), 5.0)]


def _mask_id(mask):
    causal, (left, right), softcap = mask
    return f"causal{int(causal)}-w{left}_{right}-cap{softcap:g}"


def _cases(shapes, masks):
    return [
        pytest.param(shape, mask, id=f"{'x'.join(map(str, shape))}-{_mask_id(mask)}")
        for shape in shapes
        for mask in masks
        if shape[1] <= shape[2] or (not mask[0] and mask[1][1] < 0)
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("shape,mask", _cases(CPU_SHAPES, MASKS))
def test_cpu_forward_backward(shape, mask, dtype):
    Case(shape, mask, dtype, "cpu", seed=hash((shape, mask)) % 1000).check(backward=True)


# ---- numerics on a Hopper GPU ----------------------------------------------------------------------------

GPU_SHAPES = [
    (1, 1, 1, 2, 2, 64),
    (2, 17, 17, 4, 4, 64),
    (1, 127, 128, 16, 2, 128),  # GQA 8:1
    (1, 129, 129, 8, 1, 128),  # MQA
    (1, 1013, 1024, 4, 4, 128),
    (3, 1000, 1000, 5, 5, 64),  # batch * heads = 15, not a multiple of the SM count
    (1, 256, 77, 2, 2, 256),  # seqlen_q > seqlen_k
    (1, 77, 512, 4, 2, 256),
    (1, 4097, 4097, 2, 2, 64),
]
GPU_MASKS = [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (False, (128, 0), 0.0), (True, (-1, -1), 30.0)]
GPU_DTYPES = [pytest.param(torch.bfloat16, id="bfloat16"), pytest.param(torch.float16, id="float16")]


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
def test_cuda_build_present():
    assert flash4.cuda_available(), "a Hopper GPU is present but flash4 was built without its CUDA kernels"


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("shape,mask", _cases(GPU_SHAPES, GPU_MASKS))
def test_cuda_forward(shape, mask, dtype):
    case = Case(shape, mask, dtype, "cuda", seed=hash((shape, mask)) % 1000)
    skip_unless_supported(case, backward=False)
    case.check(backward=False)


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("shape,mask", _cases(GPU_SHAPES, GPU_MASKS))
def test_cuda_backward(shape, mask, dtype):
    case = Case(shape, mask, dtype, "cuda", seed=hash((shape, mask)) % 1000)
    skip_unless_supported(case, backward=True)
    case.check(backward=True)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_backward_is_bit_identical(device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    case = Case((2, 300, 300, 8, 2, 128), (True, (-1, -1), 0.0), dtype, device)
    skip_unless_supported(case, backward=True)
    first = case.run_flash4(backward=True, deterministic=True)[2]
    for _ in range(4):
        again = case.run_flash4(backward=True, deterministic=True)[2]
        for a, b in zip(first, again):
            assert torch.equal(a, b)


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
def test_cuda_runs_on_current_stream():
    case = Case((2, 256, 256, 4, 4, 128), (True, (-1, -1), 0.0), torch.bfloat16, "cuda")
    expected = case.run_flash4(backward=False)[0]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = flash4.flash_attn_func(case.q, case.k, case.v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out, expected)


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
def test_cuda_graph_capture_forward():
    # The op must be capturable: no synchronization, no cross-stream waits, no allocation outside torch's.
    case = Case((2, 256, 256, 4, 4, 128), (True, (-1, -1), 0.0), torch.bfloat16, "cuda")
    expected = case.run_flash4(backward=False)[0]
    q, k, v = (torch.randn_like(t) for t in (case.q, case.k, case.v))  # static input buffers
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flash4.flash_attn_func(q, k, v, causal=True)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash4.flash_attn_func(q, k, v, causal=True)
    for buffer, value in zip((q, k, v), (case.q, case.k, case.v)):
        buffer.copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


# ---- autograd, layouts and torch.compile ------------------------------------------------------------------


def test_fully_masked_rows():
    case = Case((1, 20, 5, 2, 2, 64), (True, (-1, -1), 0.0), torch.float32, "cpu")
    out, lse, grads = case.run_flash4(backward=True)
    assert torch.all(out[:, :15] == 0) and torch.all(torch.isneginf(lse[:, :, :15]))
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.all(grads[0][:, :15] == 0)


def test_lse_is_not_differentiable():
    q = torch.randn(1, 8, 2, 64, requires_grad=True)
    out, lse = flash4.flash_attn_func(q, q, q, return_lse=True)
    assert out.requires_grad and not lse.requires_grad


def test_only_some_inputs_require_grad():
    q = torch.randn(1, 8, 2, 64, requires_grad=True)
    k, v = torch.randn(1, 8, 2, 64), torch.randn(1, 8, 2, 64)
    flash4.flash_attn_func(q, k, v).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("residual", [True, False], ids=["residual", "attention_only"])
def test_second_derivative_raises_instead_of_dropping_attention(residual):
    # A gradient penalty: the gradient of the loss, taken with create_graph=True, differentiated again. The
    # library's gradients are constants to autograd, so where another path keeps the graph alive (a residual)
    # the second derivative would silently miss attention's part; it must raise, naming the cause.
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(1, 5, 2, 64)
    h = x @ w * 0.1
    out = flash4.flash_attn_func(h, h, h)
    loss = ((out + h if residual else out) ** 2).sum()
    (g,) = torch.autograd.grad(loss, w, create_graph=True)
    with pytest.raises(RuntimeError, match="second derivative through flash4 attention"):
        (g**2).sum().backward()


def test_first_derivative_with_create_graph_is_unchanged():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 7, 2, 64, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, 7, 2, 64)
    plain = torch.autograd.grad(flash4.flash_attn_func(q, k, v, causal=True), (q, k, v), dout)
    graphed = torch.autograd.grad(flash4.flash_attn_func(q, k, v, causal=True), (q, k, v), dout, create_graph=True)
    for a, b in zip(plain, graphed):
        assert torch.equal(a, b) and b.requires_grad


# ---- torch.func ------------------------------------------------------------------------------------------


def _same_or_close(got, want):
    """Bit for bit on the CPU; within bf16's rounding on the GPU, whose atomic additions take any order."""
    if got.is_cuda:
        torch.testing.assert_close(got, want)
    else:
        assert torch.equal(got, want)


def _func_inputs(device, seed=0):
    """q (1, 9, 4, 64), k and v GQA 2:1, in float32 on the CPU and bf16 on the GPU."""
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    make = lambda *s: torch.randn(*s, generator=gen).to(device, dtype)  # noqa: E731
    return make(1, 9, 4, 64), make(1, 9, 2, 64), make(1, 9, 2, 64)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_func_grad_equals_autograd(device):
    q, k, v = _func_inputs(device)

    def loss(q, k, v):
        return flash4.flash_attn_func(q, k, v, causal=True).float().pow(2).sum()

    grads = torch.func.grad(loss, argnums=(0, 1, 2))(q, k, v)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    loss(*leaves).backward()
    for got, leaf in zip(grads, leaves):  # the GPU adds dQ / dK in any order outside deterministic mode
        _same_or_close(got, leaf.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_func_vmap_and_per_sample_gradients(device):
    # vmap folds the mapped dimension into flash4's batch (one call); per-sample gradients are vmap(grad(...)).
    q, k, v = _func_inputs(device, seed=1)
    samples = torch.stack([q[0], q[0].flip(0), q[0] * 0.5])  # (3, 9, 4, 64): mapped over dim 0
    out = torch.func.vmap(lambda x: flash4.flash_attn_func(x[None], k, v, causal=True)[0])(samples)
    for i, x in enumerate(samples):
        _same_or_close(out[i], flash4.flash_attn_func(x[None], k, v, causal=True)[0])

    def loss(x, k):
        return flash4.flash_attn_func(x[None], k, v).float().pow(2).sum()

    per_sample = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1)), in_dims=(0, None))(samples, k)
    for i, x in enumerate(samples):
        for got, want in zip(per_sample, torch.func.grad(loss, argnums=(0, 1))(x, k)):
            _same_or_close(got[i], want)


def test_torch_func_jacrev_equals_the_autograd_jacobian():
    q, k, v = (t[:, :5, :, :16] for t in _func_inputs("cpu", seed=2))
    f = lambda q: flash4.flash_attn_func(q, k, v, causal=True)  # noqa: E731
    torch.testing.assert_close(torch.func.jacrev(f)(q), torch.autograd.functional.jacobian(f, q), rtol=1e-6,
                               atol=1e-6)


def test_torch_func_refusals():
    q, k, v = _func_inputs("cpu")
    sink = torch.randn(4)
    with pytest.raises(NotImplementedError, match="vmap over flash4 attention takes dense batches without a "
                                                  "learnable_sink"):
        torch.func.vmap(lambda x: flash4.flash_attn_func(x, k, v, learnable_sink=sink))(q[None])
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="vmap over flash4 attention takes dense batches"):
        torch.func.vmap(lambda x: flash4.flash_attn_varlen_func(x, k[0], v[0], cu, cu, 5, 5))(q)
    with pytest.raises(RuntimeError, match="second derivative through flash4 attention|jvp"):
        torch.func.hessian(lambda x: flash4.flash_attn_func(x, k, v).sum())(q)


def test_inference_mode():
    q = torch.randn(1, 8, 2, 64)
    with torch.inference_mode():
        out = flash4.flash_attn_func(q, q, q, causal=True)
    assert out.shape == q.shape


# ---- the nn layer and the SDPA stand-in ------------------------------------------------------------------


@pytest.mark.parametrize("heads_kv", [4, 2, 1])
def test_nn_attention_matches_sdpa(heads_kv):
    from flash4.nn import Attention

    torch.manual_seed(0)
    dim, heads = 128, 4
    layer = Attention(dim, heads, heads_kv, causal=True, bias=True).double()
    x = torch.randn(2, 37, dim, dtype=torch.float64)
    layer32 = Attention(dim, heads, heads_kv, causal=True, bias=True)
    layer32.load_state_dict({name: p.float() for name, p in layer.state_dict().items()})

    # The same layer written with SDPA in float64.
    head_dim = dim // heads
    qkv = layer.qkv(x).view(2, 37, heads + 2 * heads_kv, head_dim)
    q, k, v = qkv.split([heads, heads_kv, heads_kv], dim=2)
    y = sdpa_reference(q, k, v, head_dim**-0.5, True, (-1, -1))
    expected = layer.out(y.reshape(2, 37, dim))

    out = layer32(x.float())
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(layer32.qkv.weight.grad.double(), layer.qkv.weight.grad, rtol=1e-3, atol=1e-4)


def test_nn_attention_rejects_bad_heads():
    from flash4.nn import Attention

    with pytest.raises(ValueError, match="heads_kv"):
        Attention(128, 4, 3)
    with pytest.raises(ValueError, match="multiple of heads"):
        Attention(100, 8)
    with pytest.raises(ValueError, match=r"heads_kv = 0 must be >= 1"):
        Attention(64, 4, 0)
    with pytest.raises(ValueError, match=r"heads = 0 must be >= 1"):
        Attention(64, 0)


@pytest.mark.parametrize("seqlen_q,seqlen_k,is_causal", [(33, 33, True), (40, 20, True), (20, 40, False)])
def test_sdpa_standin(seqlen_q, seqlen_k, is_causal):
    torch.manual_seed(0)
    q = torch.randn(2, 4, seqlen_q, 64, dtype=torch.float64)
    k = torch.randn(2, 2, seqlen_k, 64, dtype=torch.float64)
    v = torch.randn(2, 2, seqlen_k, 64, dtype=torch.float64)
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    out = flash4.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=is_causal)
    assert out.shape == expected.shape
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)


def test_sdpa_standin_scale_zero_weighs_keys_equally():
    # SDPA's scale = 0 means zero scores (uniform weights), not flash4's "default scale"; dq is then 0.
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, k, v, scale=0.0)
    expected.sum().backward()
    expected_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    out = flash4.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.0)
    out.sum().backward()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)
    for t, g in zip((q, k, v), expected_grads):
        torch.testing.assert_close(t.grad, g, rtol=1e-5, atol=1e-6)


def test_sdpa_standin_refuses_what_it_cannot_do():
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        flash4.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    k = torch.randn(1, 2, 16, 64)
    with pytest.raises(NotImplementedError, match="seqlen_q < seqlen_k"):
        flash4.scaled_dot_product_attention(q, k, k, is_causal=True)
    # Named in SDPA's layout (not in the transposed views flash4 takes), and not an AttributeError.
    with pytest.raises(ValueError, match=r"key must have 4 dimensions \(batch, heads, seqlen, head_dim\), got shape "
                                         r"\(2, 8, 64\)"):
        flash4.scaled_dot_product_attention(q, q[0], q)
    with pytest.raises(TypeError, match=r"value must be a torch.Tensor \(batch, heads, seqlen, head_dim\), got list"):
        flash4.scaled_dot_product_attention(q, q, [0.0])


# ---- errors ----------------------------------------------------------------------------------------------


def test_error_wrong_rank():
    q = torch.randn(8, 2, 64)
    with pytest.raises(ValueError, match="q must have 4 dimensions"):
        flash4.flash_attn_func(q, q, q)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
def test_error_unsupported_dtype(dtype):
    q = torch.ones(1, 8, 2, 64, dtype=dtype)
    with pytest.raises(TypeError, match="q has dtype"):
        flash4.flash_attn_func(q, q, q)


def test_error_dtype_mismatch():
    q = torch.randn(1, 8, 2, 64)
    with pytest.raises(TypeError, match=r"k\.dtype is bf16 but q\.dtype is fp32"):
        flash4.flash_attn_func(q, q.bfloat16(), q)


def test_error_mixed_array_types():
    q = torch.randn(1, 8, 2, 64)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        flash4.flash_attn_func(q, np.zeros((1, 8, 2, 64), np.float32), q)


def test_error_heads_not_divisible():
    q = torch.randn(1, 8, 3, 64)
    k = torch.randn(1, 8, 2, 64)
    with pytest.raises(ValueError, match="heads_kv"):
        flash4.flash_attn_func(q, k, k)


def test_error_head_dim_too_large():
    q = torch.randn(1, 8, 1, 264)
    with pytest.raises(ValueError, match="head_dim"):
        flash4.flash_attn_func(q, q, q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_error_mixed_devices():
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="one device"):
        flash4.flash_attn_func(q, q.cuda(), q.cuda())


@pytest.mark.skipif(not torch.cuda.is_available() or hopper_present(), reason="needs a non-Hopper CUDA device")
def test_error_unsupported_gpu():
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(NotImplementedError):
        flash4.flash_attn_func(q, q, q)

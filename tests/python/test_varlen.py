"""flash4.flash_attn_varlen_func and the learnable sink with torch tensors: forward, lse and gradients (q, k, v
and the sink) against a float64 torch reference computed per sequence, with the tolerance rule; the custom ops
under opcheck and torch.compile(fullgraph=True); the numpy forward; argument errors. On the CPU, and on CUDA
where a Hopper GPU is present."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flash4  # noqa: E402
from attention_reference import UNIT_ROUNDOFF, check_tolerance  # noqa: E402
from torch_reference import attention, stored_output_delta  # noqa: E402

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def hopper_present():
    return torch.cuda.is_available() and torch.cuda.get_device_capability(0)[0] == 9


DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", marks=pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU"),
                 id="cuda"),
]


def offsets(lengths, device):
    return torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int32, device=device)


def segment_attention(q, k, v, scale, causal, window, softcap, sink, round_to=None, delta=None):
    """(out, lse) of one sequence, q (sq, heads, d), k/v (sk, heads_kv, d), delta (heads, sq):
    torch_reference.attention on a batch of one."""
    delta = None if delta is None else delta[None]
    out, lse = attention(q[None], k[None], v[None], scale, causal, window, softcap, round_to=round_to, sink=sink,
                         delta=delta)
    return out[0], lse[0]


def packed_attention(q, k, v, lens_q, lens_k, scale, causal, window, softcap, sink, round_to=None, used_q=None,
                     used_k=None, delta=None):
    """segment_attention on every sequence of a packed batch; rows in no sequence get out 0 and lse -inf. delta
    (heads, total_q): the naive backward's D from the stored output (torch_reference.stored_output_delta)."""
    out = q.new_zeros(q.shape[:-1] + v.shape[-1:])  # v's head dim
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=q.dtype, device=q.device)
    outs, lses = [], []
    q0 = k0 = 0
    for b, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        nq = sq if used_q is None else used_q[b]
        nk = sk if used_k is None else used_k[b]
        o, l = segment_attention(q[q0:q0 + nq], k[k0:k0 + nk], v[k0:k0 + nk], scale, causal, window, softcap, sink,
                                 round_to, None if delta is None else delta[:, q0:q0 + nq])
        outs.append((q0, nq, o, l))
        q0 += sq
        k0 += sk
    pieces, lse_pieces, at = [], [], 0
    for q0, nq, o, l in outs:  # assembled with cat so autograd sees every piece
        if q0 > at:
            pieces.append(out[at:q0])
            lse_pieces.append(lse[:, at:q0])
        pieces.append(o)
        lse_pieces.append(l)
        at = q0 + nq
    pieces.append(out[at:])
    lse_pieces.append(lse[:, at:])
    return torch.cat(pieces, 0), torch.cat(lse_pieces, 1)


def numpy64(t):
    return t.detach().to("cpu", torch.float64).numpy()


class VarlenCase:
    def __init__(self, lens_q, lens_k, heads, heads_kv, dim, dtype, device, causal=False, window=(-1, -1),
                 softcap=0.0, sink=False, used_q=None, used_k=None, pad_q=0, seed=0, dim_v=None):
        self.lens_q, self.lens_k, self.used_q, self.used_k = lens_q, lens_k, used_q, used_k
        self.causal, self.window, self.softcap = causal, window, softcap
        self.dtype, self.device = dtype, device
        self.dsink_rounding_bound = 0.0  # set by run_torch(round_to=...) with a sink
        self.scale = dim**-0.5
        gen = torch.Generator().manual_seed(seed)

        def make(*size, dt=dtype):
            return torch.randn(*size, generator=gen, dtype=torch.float64).to(device=device, dtype=dt)

        total_q, total_k = sum(lens_q) + pad_q, sum(lens_k)
        self.q = make(total_q, heads, dim)
        self.k = make(total_k, heads_kv, dim)
        dim_v = dim if dim_v is None else dim_v  # v's and out's head dim
        self.v = make(total_k, heads_kv, dim_v)
        self.dout = make(total_q, heads, dim_v)
        self.sink = make(heads, dt=torch.float32) if sink else None
        self.cu_q, self.cu_k = offsets(lens_q, device), offsets(lens_k, device)

    def run_flash4(self, **extra):
        leaves = [t.clone().requires_grad_(True) for t in (self.q, self.k, self.v)]
        sink = None if self.sink is None else self.sink.clone().requires_grad_(True)
        used = lambda x: None if x is None else torch.tensor(x, dtype=torch.int32, device=self.device)  # noqa: E731
        out, lse = flash4.flash_attn_varlen_func(
            *leaves, self.cu_q, self.cu_k, max(self.lens_q + [1]), max(self.lens_k + [1]), causal=self.causal,
            window_size=self.window, softcap=self.softcap, return_lse=True, seqused_q=used(self.used_q),
            seqused_k=used(self.used_k), learnable_sink=sink, **extra)
        out.backward(self.dout)
        grads = [t.grad for t in leaves] + ([sink.grad] if sink is not None else [])
        return out, lse, grads

    def run_torch(self, round_to=None, stored_out=None):
        """The reference (round_to None) or the naive baseline, whose backward takes D from stored_out: the output
        that the implementation's backward was given."""
        leaves = [t.detach().double().requires_grad_(True) for t in (self.q, self.k, self.v)]
        sink = None if self.sink is None else self.sink.detach().double().requires_grad_(True)
        delta = None if stored_out is None else stored_output_delta(stored_out, self.dout)
        out, lse = packed_attention(*leaves, self.lens_q, self.lens_k, self.scale, self.causal, self.window,
                                    self.softcap, sink, round_to, self.used_q, self.used_k, delta)
        out.backward(self.dout.double())
        grads = [t.grad for t in leaves] + ([sink.grad] if sink is not None else [])
        if round_to is not None:  # the naive baseline returns its gradients in the dtype, as flash4 and the dense
            grads = [g.to(round_to).double() for g in grads[:3]] + grads[3:]  # tests' baseline do (sink: fp32)
            if sink is not None:
                # The bound of what O's rounding does to dsink through D, u * sum |dO * O| per row, added to its
                # atol as the C++ judge does (Gradients::dsink_rounding_bound).
                lse_d = lse.detach()
                p_sink = torch.where(torch.isfinite(lse_d), torch.exp(sink.detach()[:, None] - lse_d),
                                     torch.zeros_like(lse_d))
                o = out.detach() if stored_out is None else stored_out.detach().double()
                abs_dot = (self.dout.double() * o).abs().sum(-1)
                u = UNIT_ROUNDOFF[DTYPE_NAMES[self.dtype]]
                self.dsink_rounding_bound = u * float((p_sink * abs_dot.T).sum(-1).max())
        return out, lse, grads

    def check(self):
        name = DTYPE_NAMES[self.dtype]
        out, lse, grads = self.run_flash4()
        assert out.shape == self.q.shape[:-1] + self.v.shape[-1:] and out.dtype == self.dtype
        assert lse.shape == (self.q.shape[1], self.q.shape[0]) and lse.dtype == torch.float32
        ref_out, ref_lse, ref_grads = self.run_torch()
        naive_out, naive_lse, naive_grads = self.run_torch(round_to=self.dtype, stored_out=out)
        check_tolerance("out", numpy64(out), numpy64(ref_out), numpy64(naive_out), name)
        check_tolerance("lse", numpy64(lse), numpy64(ref_lse), numpy64(naive_lse), "float32",
                        1e-4 if self.q.is_cuda else 0.0)
        for what, g, r, n in zip(("dq", "dk", "dv", "dsink"), grads, ref_grads, naive_grads):
            extra = self.dsink_rounding_bound if what == "dsink" else 0.0
            check_tolerance(what, numpy64(g), numpy64(r), numpy64(n), name, extra)
        if self.sink is not None:
            assert grads[3].dtype == torch.float32 and grads[3].shape == self.sink.shape


CASES = {
    "mixed": dict(lens_q=[0, 1, 17, 64, 3], lens_k=[0, 1, 17, 64, 3]),
    "ragged-causal-mqa": dict(lens_q=[5, 1, 40, 0], lens_k=[9, 30, 40, 2], heads=4, heads_kv=1, causal=True),
    "sink-gqa": dict(lens_q=[7, 33, 1], lens_k=[20, 33, 0], heads=4, heads_kv=2, sink=True),
    "window-softcap-sink": dict(lens_q=[40, 9], lens_k=[50, 9], window=(8, 2), softcap=5.0, sink=True),
    "seqused-pad": dict(lens_q=[12, 6], lens_k=[10, 8], used_q=[5, 6], used_k=[10, 3], pad_q=4, causal=True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_varlen_forward_backward(case, dtype, device):
    spec = dict(heads=2, heads_kv=2, dim=64)
    spec.update(CASES[case])
    c = VarlenCase(dtype=dtype, device=device, **spec)
    try:
        c.check()
    except NotImplementedError as e:
        if device == "cuda":
            pytest.skip(f"not supported on this GPU by flash4: {e}")
        raise


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
def test_dense_sink_forward_backward(dtype, device):
    """flash_attn_func(learnable_sink=...) equals the packed path's reference on one sequence per batch entry."""
    gen = torch.Generator().manual_seed(1)
    make = lambda *s, dt=dtype: torch.randn(*s, generator=gen, dtype=torch.float64).to(device=device, dtype=dt)  # noqa: E731
    q, k, v, dout = make(2, 30, 4, 64), make(2, 20, 2, 64), make(2, 20, 2, 64), make(2, 30, 4, 64)
    sink = make(4, dt=torch.float32)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sink)]
    try:
        out, lse = flash4.flash_attn_func(*leaves[:3], causal=True, return_lse=True, learnable_sink=leaves[3])
    except NotImplementedError as e:
        pytest.skip(f"not supported on this GPU by flash4: {e}")
    assert lse.shape == (2, 4, 30)
    out.backward(dout)

    def torch_path(round_to, delta=None):
        ls = [t.detach().double().requires_grad_(True) for t in (q, k, v, sink)]
        o, l = packed_attention(ls[0].flatten(0, 1), ls[1].flatten(0, 1), ls[2].flatten(0, 1), [30, 30], [20, 20],
                                64**-0.5, True, (-1, -1), 0.0, ls[3], round_to, delta=delta)
        o.backward(dout.double().flatten(0, 1))
        return o.unflatten(0, (2, 30)), l.unflatten(1, (2, 30)).transpose(0, 1), [t.grad for t in ls]

    ref_out, ref_lse, ref_grads = torch_path(None)
    stored_delta = stored_output_delta(out.flatten(0, 1), dout.flatten(0, 1))
    naive_out, naive_lse, naive_grads = torch_path(dtype, stored_delta)
    name = DTYPE_NAMES[dtype]
    check_tolerance("out", numpy64(out), numpy64(ref_out), numpy64(naive_out), name)
    check_tolerance("lse", numpy64(lse), numpy64(ref_lse), numpy64(naive_lse), "float32", 1e-4 if q.is_cuda else 0)
    for what, t, r, n in zip(("dq", "dk", "dv", "dsink"), leaves, ref_grads, naive_grads):
        check_tolerance(what, numpy64(t.grad), numpy64(r), numpy64(n), name)


def test_sink_of_low_precision_parameter_gets_its_gradient():
    """A bf16 sink parameter (as models hold it) is cast to float32 for the library; its gradient comes back
    in bf16 through the differentiable cast."""
    torch.manual_seed(0)
    q = torch.randn(1, 8, 2, 32)
    sink = torch.zeros(2, dtype=torch.bfloat16, requires_grad=True)
    flash4.flash_attn_func(q, q, q, learnable_sink=sink).sum().backward()
    assert sink.grad is not None and sink.grad.dtype == torch.bfloat16 and torch.isfinite(sink.grad).all()


def test_sink_of_an_integer_dtype_is_refused():
    q = torch.zeros(1, 4, 2, 32)
    with pytest.raises(TypeError, match=r"learnable_sink has dtype torch.int32 but must be a floating point"):
        flash4.flash_attn_func(q, q, q, learnable_sink=torch.zeros(2, dtype=torch.int32))


def test_rows_without_keys_have_sink_lse_and_zero_output():
    q = torch.randn(6, 2, 32)
    k = torch.randn(2, 2, 32)
    sink = torch.tensor([0.5, -1.0])
    cu_q, cu_k = offsets([6], "cpu"), offsets([2], "cpu")
    out, lse = flash4.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 6, 2, causal=True, return_lse=True,
                                             learnable_sink=sink)
    # causal bottom-right with 6 queries and 2 keys: rows 0..3 see no key.
    assert torch.equal(out[:4], torch.zeros_like(out[:4]))
    assert torch.equal(lse[:, :4], sink[:, None].expand(2, 4))


def test_int64_offsets_are_converted():
    q = torch.randn(10, 2, 32)
    cu64 = torch.tensor([0, 4, 10], dtype=torch.int64)
    out64 = flash4.flash_attn_varlen_func(q, q, q, cu64, cu64, 6, 6)
    out32 = flash4.flash_attn_varlen_func(q, q, q, cu64.int(), cu64.int(), 6, 6)
    assert torch.equal(out64, out32)


def test_int64_offsets_beyond_int32_are_refused():
    # The int32 cast would wrap 2**32 + 4 to 4: offsets that look valid but are not the ones given.
    q = torch.randn(10, 2, 32)
    wrapped = torch.tensor([0, 2**32 + 4, 2**32 + 10], dtype=torch.int64)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q holds 4294967306, outside int32's range"):
        flash4.flash_attn_varlen_func(q, q, q, wrapped, cu, 6, 6)
    with pytest.raises(ValueError, match=r"seqused_k holds -4294967296, outside int32's range"):
        flash4.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, seqused_k=torch.tensor([-(2**32), 1]))


def test_varlen_equals_dense_calls_per_sequence():
    torch.manual_seed(3)
    lens = [5, 17, 1]
    q, k, v = (torch.randn(sum(lens), 4, 64, dtype=torch.bfloat16) for _ in range(3))
    cu = offsets(lens, "cpu")
    out = flash4.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    for b in range(len(lens)):
        s = slice(int(cu[b]), int(cu[b + 1]))
        dense = flash4.flash_attn_func(q[None, s], k[None, s], v[None, s], causal=True)
        assert torch.equal(out[s], dense[0])


def test_numpy_varlen_forward():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((9, 2, 32)).astype(np.float32)
    cu = np.array([0, 4, 9], dtype=np.int32)
    sink = np.array([0.3, -0.2], dtype=np.float32)
    out, lse = flash4.flash_attn_varlen_func(q, q, q, cu, cu, 5, 5, return_lse=True, learnable_sink=sink)
    ref_out, ref_lse = packed_attention(*(torch.from_numpy(q).double() for _ in range(3)), [4, 5], [4, 5],
                                        32**-0.5, False, (-1, -1), 0.0, torch.from_numpy(sink).double())
    assert out.shape == q.shape and lse.shape == (2, 9)
    np.testing.assert_allclose(out, ref_out.numpy(), atol=1e-5)
    np.testing.assert_allclose(lse, ref_lse.numpy(), atol=1e-5)


def test_opcheck_varlen_and_sink():
    torch.manual_seed(0)
    q = torch.randn(11, 4, 64)
    k = torch.randn(13, 2, 64)
    v = torch.randn(13, 2, 64)
    cu_q, cu_k = offsets([5, 6], "cpu"), offsets([6, 7], "cpu")
    sink = torch.randn(4)
    seq = (cu_q, cu_k, None, None, 6, 7, sink)
    torch.library.opcheck(torch.ops.flash4.fwd.default, (q, k, v, 0.0, True, -1, -1, 0.0, False, *seq))
    out, lse = torch.ops.flash4.fwd(q, k, v, 0.0, True, -1, -1, 0.0, False, *seq)
    torch.library.opcheck(torch.ops.flash4.bwd.default,
                          (torch.randn_like(out), q, k, v, out, lse, 0.0, True, -1, -1, 0.0, False, *seq))


class PackedBlock(torch.nn.Module):
    def __init__(self, dim=128, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.sink = torch.nn.Parameter(torch.zeros(heads))
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x, cu, max_len):
        total = x.shape[0]
        q, k, v = self.qkv(x).view(total, 3, self.heads, -1).unbind(1)
        out = flash4.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=True,
                                            learnable_sink=self.sink)
        return self.proj(out.reshape(total, -1))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_varlen_with_sink(device):
    torch.manual_seed(0)
    model = PackedBlock().to(device)
    x = torch.randn(30, 128, device=device)
    cu = offsets([10, 3, 17], device)
    if device == "cuda" and not flash4.can_implement(torch.zeros(1, 1, 2, 64, device=device),
                                                      torch.zeros(1, 1, 2, 64, device=device),
                                                      torch.zeros(1, 1, 2, 64, device=device)):
        pytest.skip("flash4 cannot run on this GPU")
    try:
        eager = model(x, cu, 17)
    except NotImplementedError as e:
        pytest.skip(f"not supported on this GPU by flash4: {e}")
    eager.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True)  # fullgraph: any graph break is an error
    out = compiled(x, cu, 17)
    out.sum().backward()
    torch.testing.assert_close(out, eager, rtol=0, atol=1e-5)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-5)
    assert model.sink.grad.abs().sum() > 0


def test_varlen_errors():
    q = torch.randn(10, 2, 32)
    cu = offsets([4, 6], "cpu")
    with pytest.raises(ValueError, match="q must have 3 dimensions"):
        flash4.flash_attn_varlen_func(q[None], q, q, cu, cu, 6, 6)
    with pytest.raises(ValueError, match="segment 1 of cu_seqlens_q has 6 tokens but max_seqlen_q = 5"):
        flash4.flash_attn_varlen_func(q, q, q, cu, cu, 5, 6)
    with pytest.raises(ValueError, match="cu_seqlens_k must be non-decreasing"):
        flash4.flash_attn_varlen_func(q, q, q, cu, torch.tensor([0, 7, 6], dtype=torch.int32), 6, 7)
    with pytest.raises(ValueError, match="learnable_sink.shape\\[0\\] \\(heads\\) = 3 but expected 2"):
        flash4.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, learnable_sink=torch.zeros(3))
    with pytest.raises(TypeError, match="cu_seqlens_q.dtype is fp32 but must be int32"):
        flash4.flash_attn_varlen_func(q, q, q, cu.float(), cu, 6, 6)
    with pytest.raises(ValueError, match="seqused_k\\[0\\] = 5 but must be in \\[0, 4\\]"):
        flash4.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, seqused_k=torch.tensor([5, 1], dtype=torch.int32))


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
def test_cuda_graph_capture_varlen_forward_and_backward():
    """The packed forward and backward ops (torch.ops.flash4.fwd / bwd) with a sink, captured in a CUDA graph and
    replayed, give the eager results: the packed GPU kernels read the sequence offsets on the device, with no host
    synchronisation. Deterministic mode, so the replayed gradients equal the eager ones bit for bit."""
    torch.manual_seed(0)
    lens = [100, 1, 257]
    q = torch.randn(sum(lens), 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lens), 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(lens), 2, 64, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn_like(q)
    sink = torch.randn(4, device="cuda")
    cu = offsets(lens, "cuda")
    seq = (cu, cu, None, None, max(lens), max(lens), sink)
    scale = 64 ** -0.5

    def step():
        out, lse = torch.ops.flash4.fwd(q, k, v, scale, True, -1, -1, 0.0, True, *seq)
        return (out,) + tuple(torch.ops.flash4.bwd(dout, q, k, v, out, lse, scale, True, -1, -1, 0.0, True, *seq))

    eager = [t.clone() for t in step()]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on the side stream, as graph capture requires
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for name, c, e in zip(("out", "dq", "dk", "dv", "dsink"), captured, eager):
        assert torch.equal(c, e), name


@pytest.mark.parametrize("device", DEVICES)
def test_opt_in_host_check_of_offsets(device, monkeypatch):
    """check_varlen_offsets (and FLASH4_CHECK_OFFSETS=1 in flash_attn_varlen_func) validates offsets that live on
    the GPU on the host, with the library's messages."""
    q = torch.randn(10, 2, 32, device=device)
    good = offsets([4, 6], device)
    flash4.check_varlen_offsets(q, q, good, good, 6, 6)
    with pytest.raises(ValueError, match="cu_seqlens_q must be non-decreasing"):
        flash4.check_varlen_offsets(q, q, torch.tensor([0, 7, 6], dtype=torch.int32, device=device), good, 7, 6)
    with pytest.raises(ValueError, match="cu_seqlens_k\\[2\\] = 12 exceeds k.shape\\[0\\] \\(total_k\\) = 10"):
        flash4.check_varlen_offsets(q, q, good, torch.tensor([0, 6, 12], dtype=torch.int32, device=device), 6, 6)
    with pytest.raises(ValueError, match="seqused_q\\[1\\] = 7 but must be in \\[0, 6\\]"):
        flash4.check_varlen_offsets(q, q, good, good, 6, 6, seqused_q=torch.tensor([1, 7], device=device))
    monkeypatch.setenv("FLASH4_CHECK_OFFSETS", "1")
    with pytest.raises(ValueError, match="segment 1 of cu_seqlens_q has 6 tokens but max_seqlen_q = 5"):
        flash4.flash_attn_varlen_func(q, q, q, good, good, 5, 6)

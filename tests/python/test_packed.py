"""flash-attn's packed entry points (flash_attn_qkvpacked_func, flash_attn_kvpacked_func and their varlen forms):
forward, lse and the packed tensors' gradients against a float64 torch reference with the tolerance rule, bit
equality with flash_attn_func / flash_attn_varlen_func on the unstacked tensors, torch.compile(fullgraph=True),
numpy arrays, return conventions and argument errors. CPU."""

import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flash4  # noqa: E402
import attention_reference  # noqa: E402
from attention_reference import check_tolerance  # noqa: E402
from torch_reference import attention, numpy64, stored_output_delta, varlen_attention  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# (causal, window, softcap)
MASKS = {"full": (False, (-1, -1), 0.0), "causal": (True, (-1, -1), 0.0), "window": (False, (8, 3), 0.0),
         "softcap": (False, (-1, -1), 5.0)}


def randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def offsets(lengths):
    return [0] + np.cumsum(lengths).tolist()


def check_against_reference(call, reference, inputs, names, dout, dtype_name):
    """call(*leaves) -> (out, lse) through flash4; reference(*leaves, round_to=..., delta=...) -> (out, lse) in
    float64, on the same (dtype-valued) inputs, the naive baseline's backward with D from flash4's stored output.
    Checks out, lse and each input's gradient with the tolerance rule."""
    dtype = DTYPES[dtype_name]
    leaves = [t.clone().requires_grad_() for t in inputs]
    out, lse = call(*leaves)
    assert out.dtype == dtype and lse.dtype == torch.float32
    out.backward(dout)
    results = {}
    for round_to in (None, dtype):
        ref_leaves = [t.detach().double().requires_grad_() for t in inputs]
        delta = None if round_to is None else stored_output_delta(out, dout)
        ref_out, ref_lse = reference(*ref_leaves, round_to=round_to, delta=delta)
        ref_out.backward(dout.double())
        grads = [t.grad if round_to is None else t.grad.to(dtype).double() for t in ref_leaves]
        results[round_to] = (ref_out, ref_lse, grads)
    (ref_out, ref_lse, ref_grads), (naive_out, naive_lse, naive_grads) = results[None], results[dtype]
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    check_tolerance("out", numpy64(out), numpy64(ref_out), numpy64(naive_out), dtype_name)
    check_tolerance("lse", numpy64(lse), numpy64(ref_lse), numpy64(naive_lse), "float32")
    for name, leaf, ref, naive in zip(names, leaves, ref_grads, naive_grads):
        assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == dtype
        check_tolerance(f"d{name}", numpy64(leaf.grad), numpy64(ref), numpy64(naive), dtype_name)


# ---- numerics --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", [(2, 37, 3, 40), (1, 1, 1, 64), (1, 70, 2, 128)], ids=lambda s: "x".join(map(str, s)))
def test_qkvpacked_matches_reference(shape, mask, dtype_name):
    batch, seqlen, heads, dim = shape
    causal, window, softcap = MASKS[mask]
    gen = torch.Generator().manual_seed(zlib.crc32(repr((shape, mask)).encode()))
    qkv = randn(gen, batch, seqlen, 3, heads, dim, dtype=DTYPES[dtype_name])
    dout = randn(gen, batch, seqlen, heads, dim, dtype=DTYPES[dtype_name])
    options = dict(causal=causal, window_size=window, softcap=softcap)

    def reference(qkv, round_to, delta):
        return attention(*qkv.unbind(2), dim**-0.5, causal, window, softcap, round_to=round_to, delta=delta)

    check_against_reference(lambda t: flash4.flash_attn_qkvpacked_func(t, return_attn_probs=True, **options),
                            reference, [qkv], ["qkv"], dout, dtype_name)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 19, 45, 6, 2, 64), (1, 33, 20, 4, 1, 32)],  # GQA 3:1; MQA, seqlen_q > seqlen_k
                         ids=lambda s: "x".join(map(str, s)))
def test_kvpacked_matches_reference(shape, causal, dtype_name):
    batch, seqlen_q, seqlen_k, heads, heads_kv, dim = shape
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(seqlen_q + int(causal))
    q = randn(gen, batch, seqlen_q, heads, dim, dtype=dtype)
    kv = randn(gen, batch, seqlen_k, 2, heads_kv, dim, dtype=dtype)
    dout = randn(gen, batch, seqlen_q, heads, dim, dtype=dtype)

    def reference(q, kv, round_to, delta):
        return attention(q, *kv.unbind(2), dim**-0.5, causal, round_to=round_to, delta=delta)

    check_against_reference(lambda q, kv: flash4.flash_attn_kvpacked_func(q, kv, causal=causal, return_lse=True),
                            reference, [q, kv], ["q", "kv"], dout, dtype_name)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("mask", ["full", "causal", "softcap"])
def test_varlen_qkvpacked_matches_reference(mask, dtype_name):
    causal, window, softcap = MASKS[mask]
    dtype = DTYPES[dtype_name]
    lens, heads, dim = [5, 0, 33, 1], 3, 40
    cu = offsets(lens)
    gen = torch.Generator().manual_seed(7)
    qkv = randn(gen, cu[-1], 3, heads, dim, dtype=dtype)
    dout = randn(gen, cu[-1], heads, dim, dtype=dtype)
    cu_t = torch.tensor(cu, dtype=torch.int32)

    def call(qkv):
        return flash4.flash_attn_varlen_qkvpacked_func(qkv, cu_t, max(lens), causal=causal, window_size=window,
                                                       softcap=softcap, return_attn_probs=True)

    def reference(qkv, round_to, delta):
        return varlen_attention(*qkv.unbind(1), cu, cu, dim**-0.5, causal=causal, window=window, softcap=softcap,
                                round_to=round_to, delta=delta)

    check_against_reference(call, reference, [qkv], ["qkv"], dout, dtype_name)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("mask", ["causal", "window"])
def test_varlen_kvpacked_matches_reference(mask, dtype_name):
    causal, window, _ = MASKS[mask]
    dtype = DTYPES[dtype_name]
    lens_q, lens_k, heads, heads_kv, dim = [3, 17, 0, 8], [10, 17, 4, 0], 4, 2, 64
    cu_q, cu_k = offsets(lens_q), offsets(lens_k)
    gen = torch.Generator().manual_seed(11)
    q = randn(gen, cu_q[-1], heads, dim, dtype=dtype)
    kv = randn(gen, cu_k[-1], 2, heads_kv, dim, dtype=dtype)
    dout = randn(gen, cu_q[-1], heads, dim, dtype=dtype)
    cu_q_t, cu_k_t = torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32)

    def call(q, kv):
        return flash4.flash_attn_varlen_kvpacked_func(q, kv, cu_q_t, cu_k_t, max(lens_q), max(lens_k), causal=causal,
                                                      window_size=window, return_lse=True)

    def reference(q, kv, round_to, delta):
        return varlen_attention(q, *kv.unbind(1), cu_q, cu_k, dim**-0.5, causal=causal, window=window,
                                round_to=round_to, delta=delta)

    check_against_reference(call, reference, [q, kv], ["q", "kv"], dout, dtype_name)


# ---- the wrappers are the unpacked calls -------------------------------------------------------------------------


def _cases():
    """(packed call, the same through the unpacked entry point, packed inputs, axis of the stacked dimension)."""
    gen = torch.Generator().manual_seed(3)
    lens_q, lens_k = [4, 9], [6, 9]
    cu_q, cu_k = torch.tensor(offsets(lens_q), dtype=torch.int32), torch.tensor(offsets(lens_k), dtype=torch.int32)
    opts = dict(causal=True, return_lse=True)
    return {
        "qkvpacked": (lambda qkv: flash4.flash_attn_qkvpacked_func(qkv, **opts),
                      lambda q, k, v: flash4.flash_attn_func(q, k, v, **opts),
                      [randn(gen, 2, 21, 3, 4, 32, dtype=torch.float32)], 2),
        "kvpacked": (lambda q, kv: flash4.flash_attn_kvpacked_func(q, kv, **opts),
                     lambda q, k, v: flash4.flash_attn_func(q, k, v, **opts),
                     [randn(gen, 2, 11, 4, 32, dtype=torch.float32), randn(gen, 2, 21, 2, 2, 32, dtype=torch.float32)],
                     2),
        "varlen_qkvpacked": (lambda qkv: flash4.flash_attn_varlen_qkvpacked_func(qkv, cu_k, 9, **opts),
                             lambda q, k, v: flash4.flash_attn_varlen_func(q, k, v, cu_k, cu_k, 9, 9, **opts),
                             [randn(gen, 15, 3, 4, 32, dtype=torch.float32)], 1),
        "varlen_kvpacked": (lambda q, kv: flash4.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 9, 9, **opts),
                            lambda q, k, v: flash4.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 9, **opts),
                            [randn(gen, 13, 4, 32, dtype=torch.float32), randn(gen, 15, 2, 2, 32, dtype=torch.float32)],
                            1),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_packed_equals_unpacked_call(name):
    packed_call, unpacked_call, inputs, axis = _cases()[name]
    leaves = [t.clone().requires_grad_() for t in inputs]
    out, lse = packed_call(*leaves)
    dout = torch.randn_like(out)
    out.backward(dout)

    separate = [t.clone().requires_grad_() for t in inputs[:-1]] + \
        [t.contiguous().requires_grad_() for t in inputs[-1].unbind(axis)]
    expected_out, expected_lse = unpacked_call(*separate)
    expected_out.backward(dout)
    assert torch.equal(out, expected_out) and torch.equal(lse, expected_lse)
    packed_grad = torch.stack([t.grad for t in separate[len(inputs) - 1:]], axis)
    assert torch.equal(leaves[-1].grad, packed_grad)
    if len(inputs) == 2:
        assert torch.equal(leaves[0].grad, separate[0].grad)


class QkvPackedBlock(torch.nn.Module):
    """A fused q/k/v projection viewed as (..., 3, heads, head_dim), attention on the packed tensor."""

    def __init__(self, varlen, dim=128, heads=2):
        super().__init__()
        self.varlen, self.heads = varlen, heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x, cu, max_len):
        qkv = self.qkv(x).unflatten(-1, (3, self.heads, -1))
        if self.varlen:
            out = flash4.flash_attn_varlen_qkvpacked_func(qkv, cu, max_len, causal=True)
        else:
            out = flash4.flash_attn_qkvpacked_func(qkv, causal=True)
        return self.proj(out.flatten(-2))


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_compile_fullgraph(varlen):
    torch.manual_seed(0)
    model = QkvPackedBlock(varlen)
    x = torch.randn(30, 128) if varlen else torch.randn(2, 15, 128)
    cu = torch.tensor([0, 10, 13, 30], dtype=torch.int32)
    eager = model(x, cu, 17)
    eager.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)  # fullgraph: any graph break is an error
    out = compiled(x, cu, 17)
    out.square().mean().backward()
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
    assert model.qkv.weight.grad.abs().sum() > 0


# ---- numpy, return conventions, errors ---------------------------------------------------------------------------


def test_numpy_packed_forward():
    rng = np.random.default_rng(5)
    qkv = rng.standard_normal((2, 23, 3, 2, 64)).astype(np.float32)
    out, lse = flash4.flash_attn_qkvpacked_func(qkv, causal=True, return_lse=True)
    q, k, v = (qkv[:, :, i] for i in range(3))
    ref_out, ref_lse = attention_reference.attention(q, k, v, causal=True)
    naive_out, naive_lse = attention_reference.attention(q, k, v, causal=True, round_to=np.float32)
    check_tolerance("out", out, ref_out, naive_out, "float32")
    check_tolerance("lse", lse, ref_lse, naive_lse, "float32")
    q1 = rng.standard_normal((9, 2, 64)).astype(np.float32)
    kv = rng.standard_normal((12, 2, 1, 64)).astype(np.float32)
    cu_q, cu_k = np.array([0, 4, 9], np.int32), np.array([0, 5, 12], np.int32)
    out = flash4.flash_attn_varlen_kvpacked_func(q1, kv, cu_q, cu_k, 5, 7)
    assert np.array_equal(out, flash4.flash_attn_varlen_func(q1, kv[:, 0], kv[:, 1], cu_q, cu_k, 5, 7))


def test_return_conventions():
    qkv = torch.randn(1, 8, 3, 2, 32)
    out = flash4.flash_attn_qkvpacked_func(qkv)
    assert isinstance(out, torch.Tensor) and out.shape == (1, 8, 2, 32)
    for flag in ("return_attn_probs", "return_lse"):
        out2, lse = flash4.flash_attn_qkvpacked_func(qkv, **{flag: True})
        assert torch.equal(out2, out) and lse.shape == (1, 2, 8) and not lse.requires_grad
    # flash-attn's positional order: dropout_p, softmax_scale, causal
    assert torch.equal(flash4.flash_attn_qkvpacked_func(qkv, 0.0, 0.3, True),
                       flash4.flash_attn_qkvpacked_func(qkv, softmax_scale=0.3, causal=True))


def test_refuses_dropout_and_alibi():
    qkv = torch.randn(1, 8, 3, 2, 32)
    with pytest.raises(NotImplementedError, match="dropout_p must be 0"):
        flash4.flash_attn_qkvpacked_func(qkv, 0.1)
    with pytest.raises(NotImplementedError, match="alibi_slopes must be None"):
        flash4.flash_attn_kvpacked_func(qkv[:, :, 0], qkv[:, :, 1:], alibi_slopes=torch.ones(2))
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="dropout_p must be 0"):
        flash4.flash_attn_varlen_qkvpacked_func(qkv[0], cu, 8, dropout_p=0.5)


def test_bad_packed_tensors():
    q = torch.randn(1, 8, 2, 32)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    cases = [
        (lambda: flash4.flash_attn_qkvpacked_func(q), r"qkv must have 5 dimensions \(batch, seqlen, 3, heads, "),
        (lambda: flash4.flash_attn_qkvpacked_func(torch.randn(1, 8, 4, 2, 32)), r"qkv.shape\[2\] must be 3 .*got "
         r"shape \(1, 8, 4, 2, 32\)"),
        (lambda: flash4.flash_attn_kvpacked_func(q, torch.randn(1, 8, 3, 2, 32)), r"kv.shape\[2\] must be 2"),
        (lambda: flash4.flash_attn_kvpacked_func(q, q), r"kv must have 5 dimensions \(batch, seqlen_k, 2, heads_kv"),
        (lambda: flash4.flash_attn_varlen_qkvpacked_func(torch.randn(8, 2, 2, 32), cu, 8), r"qkv.shape\[1\] must be 3"),
        (lambda: flash4.flash_attn_varlen_qkvpacked_func(torch.randn(1, 8, 3, 2, 32), cu, 8),
         r"qkv must have 4 dimensions \(total, 3, heads, head_dim\)"),
        (lambda: flash4.flash_attn_varlen_kvpacked_func(q[0], torch.randn(8, 1, 2, 32), cu, cu, 8, 8),
         r"kv.shape\[1\] must be 2"),
        (lambda: flash4.flash_attn_kvpacked_func(torch.randn(1, 8, 3, 32), torch.randn(1, 8, 2, 2, 32)), "heads_kv"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(TypeError, match="qkv must be an array"):
        flash4.flash_attn_qkvpacked_func([[1.0]])
    with pytest.raises(TypeError, match="kv must be a torch.Tensor like q"):
        flash4.flash_attn_kvpacked_func(q, np.zeros((1, 8, 2, 2, 32), np.float32))

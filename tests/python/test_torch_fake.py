"""flash4's torch entry points on tensors without data: fake tensors (FakeTensorMode, as torch.compile's tracing
and memory estimators use them) and meta tensors (a model built on the meta device) get the outputs and
gradients the real call gives, in shape, dtype and strides, through the custom ops' fake implementations."""

import pytest

torch = pytest.importorskip("torch")

import flash4  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


def _layout(tensors):
    return [(tuple(t.shape), t.dtype, t.stride()) for t in tensors]


def _dense(q, k, v, sink=None):
    return flash4.flash_attn_func(q, k, v, causal=True, return_lse=True, learnable_sink=sink)


def _varlen(q, k, v, sink=None):
    cu = torch.tensor([0, 5, q.shape[0]], dtype=torch.int64)  # int64: converted without reading its values
    return flash4.flash_attn_varlen_func(q, k, v, cu, cu, 15, 15, return_lse=True, learnable_sink=sink)


def _kvcache(q, k_cache, v_cache):
    k = v = torch.ones(q.shape[0], 1, *k_cache.shape[2:], dtype=k_cache.dtype)
    return flash4.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=3, return_softmax_lse=True)


def _fp8(q, k, v):
    q, k, v = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    return flash4.flash_attn_func(q, k, v, return_lse=True)


# (entry point, q shape, k shape, v shape): GQA and a head_dim_v that differs from head_dim.
CASES = {
    "dense": (_dense, (2, 9, 8, 64), (2, 11, 2, 64), (2, 11, 2, 32)),
    "varlen": (_varlen, (20, 4, 64), (20, 2, 64), (20, 2, 48)),
    "kvcache": (_kvcache, (2, 1, 4, 64), (2, 16, 2, 64), (2, 16, 2, 64)),
    "fp8": (_fp8, (2, 9, 4, 64), (2, 9, 4, 64), (2, 9, 4, 64)),
}


def _inputs(shapes, dtype, grad):
    return [torch.randn(s, dtype=dtype, requires_grad=grad) for s in shapes]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("where", ["fake", "meta"])
def test_outputs_without_data_match_the_real_call(name, where):
    fn, *shapes = CASES[name]
    expected = _layout(fn(*_inputs(shapes, torch.bfloat16, False)))
    if where == "fake":
        with FakeTensorMode():
            got = _layout(fn(*_inputs(shapes, torch.bfloat16, False)))
    else:
        with torch.device("meta"):
            got = _layout(fn(*_inputs(shapes, torch.bfloat16, False)))
    assert got == expected


@pytest.mark.parametrize("name", ["dense", "varlen"])
@pytest.mark.parametrize("where", ["fake", "meta"])
def test_gradients_without_data_match_the_real_call(name, where):
    fn, *shapes = CASES[name]

    def grads():
        q, k, v = _inputs(shapes, torch.float32, True)
        sink = torch.zeros(q.shape[-2], requires_grad=True)
        out, _ = fn(q, k, v, sink)
        out.sum().backward()
        return [t.grad for t in (q, k, v, sink)]

    expected = _layout(grads())
    context = FakeTensorMode() if where == "fake" else torch.device("meta")
    with context:
        got = _layout(grads())
    assert got == expected


def test_model_on_the_meta_device():
    # Shape inference over a model built without memory (torch.device("meta"), then to_empty for real).
    from flash4.nn import Attention

    with torch.device("meta"):
        model = Attention(64, 4, 2, causal=True)
        x = torch.randn(2, 10, 64, requires_grad=True)
        y = model(x)
        y.sum().backward()
    assert y.is_meta and y.shape == (2, 10, 64) and x.grad.shape == x.shape


def test_fake_mode_over_a_real_model():
    # A memory or FLOP estimator runs a real model's forward under FakeTensorMode: the parameters are real, the
    # activations fake.
    from flash4.nn import Attention

    model = Attention(64, 4, 2, causal=True)
    with FakeTensorMode(allow_non_fake_inputs=True):
        y = model(torch.randn(2, 10, 64))
        y.sum().backward()
    assert y.shape == (2, 10, 64)


def test_meta_and_real_tensors_are_not_mixed():
    # The op would answer a mix with meta outputs (and the KV-cache op with no append): refused by name.
    q = torch.randn(1, 8, 2, 64)
    with pytest.raises(ValueError, match=r"k is on the meta device; flash4 runs on cpu and cuda tensors"):
        flash4.flash_attn_func(q, q.to("meta"), q)
    with pytest.raises(ValueError, match=r"learnable_sink is on the meta device but q is on cpu"):
        flash4.flash_attn_func(q, q, q, learnable_sink=torch.zeros(2, device="meta"))
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_k is on the meta device but q is on cpu"):
        flash4.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu.to("meta"), 8, 8)
    with pytest.raises(ValueError, match=r"cache_seqlens is on the meta device but q is on cpu"):
        flash4.flash_attn_with_kvcache(q, q.clone(), q.clone(), cache_seqlens=torch.zeros(1, dtype=torch.int32,
                                                                                           device="meta"))


def test_plain_tensors_and_parameters_keep_the_eager_shortcut():
    # The custom op's dispatch costs host time on every call; a learnable_sink is an nn.Parameter.
    from flash4._torch_ops import through_custom_op

    q = torch.randn(1, 8, 2, 64)
    assert not through_custom_op(q=q, k=q, v=q, learnable_sink=torch.nn.Parameter(torch.zeros(2)), seqused_q=None)
    with FakeTensorMode():
        assert through_custom_op(q=torch.randn(1, 8, 2, 64))
    assert through_custom_op(q=q.to("meta"))

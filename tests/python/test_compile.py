"""flash4's custom ops under torch.compile and opcheck: a transformer block compiled with fullgraph=True (no
graph break) matches eager, forward and backward, and float options that Dynamo traces as symbolic floats
(a second distinct value, dynamic=True) stay in the graph."""

import pytest

torch = pytest.importorskip("torch")

import flash4  # noqa: E402
from torch_devices import DEVICES  # noqa: E402


def test_opcheck():
    torch.manual_seed(0)
    q = torch.randn(1, 17, 4, 64, requires_grad=True)
    k = torch.randn(1, 23, 2, 64, requires_grad=True)
    v = torch.randn(1, 23, 2, 64, requires_grad=True)
    torch.library.opcheck(torch.ops.flash4.fwd.default, (q, k, v, 0.0, True, -1, -1, 0.0, False))
    out, lse = torch.ops.flash4.fwd(q.detach(), k.detach(), v.detach(), 0.0, True, -1, -1, 0.0, False)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flash4.bwd.default, (dout, q.detach(), k.detach(), v.detach(), out, lse, 0.0,
                                                         True, -1, -1, 0.0, False))


class TinyBlock(torch.nn.Module):
    def __init__(self, dim=256, heads=4, heads_kv=2):  # head_dim 64: compiled for the GPU too
        super().__init__()
        from flash4.nn import Attention

        self.norm = torch.nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, heads_kv, causal=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = TinyBlock().to(device=device, dtype=dtype)
    x = torch.randn(2, 33, 256, device=device, dtype=dtype)
    expected = model(x)
    expected.float().square().mean().backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)  # fullgraph: any graph break is an error
    out = compiled(x)
    out.float().square().mean().backward()
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 5e-2, "atol": 5e-2}
    torch.testing.assert_close(out, expected, **tol)
    for p, g in zip(model.parameters(), expected_grads):
        torch.testing.assert_close(p.grad, g, **tol)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_traces_float_options_without_graph_breaks(dynamic):
    # Dynamo turns a float argument that changes between calls (and every float with dynamic=True) into a
    # symbolic float; the option checks must only compare it, never call math.isfinite or struct on it.
    torch.manual_seed(0)
    q = torch.randn(1, 5, 2, 16)

    def attend(q, scale, cap):
        return flash4.flash_attn_func(q, q, q, softmax_scale=scale, softcap=cap, causal=True)

    torch._dynamo.reset()
    compiled = torch.compile(attend, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for scale, cap in ((0.25, 0.0), (0.5, 0.0), (0.5, 30.0), (0.75, 20.0)):
        torch.testing.assert_close(compiled(q, scale, cap), attend(q, scale, cap), rtol=1e-6, atol=1e-6)


def _frames_for(fn, calls):
    """How many graphs torch.compile(fn, fullgraph=True) builds for the calls (argument tuples), each result
    checked against eager."""
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, fullgraph=True, backend=counter)
    for args in calls:
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-6, atol=1e-6)
    return counter.frame_count


def test_varlen_max_seqlen_that_changes_does_not_recompile_each_step():
    # Packed training batches change max_seqlen every step: Dynamo makes the int symbolic after the first
    # change, and the argument checks must not specialize it back (one graph per value, then the recompile
    # limit: a hard error under fullgraph=True).
    torch.manual_seed(0)

    def attend(q, cu, max_seqlen):
        return flash4.flash_attn_varlen_func(q, q, q, cu, cu, max_seqlen, max_seqlen, causal=True)

    calls = []
    for lengths in ([3, 5], [4, 9, 2], [5, 6, 7], [10, 2], [3, 12, 2], [6, 6], [2, 11], [13, 3], [7, 14], [15]):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        calls.append((torch.randn(sum(lengths), 2, 16), cu, max(lengths)))
    assert _frames_for(attend, calls) <= 2


def test_kvcache_decode_position_as_int_does_not_recompile_each_step():
    torch.manual_seed(0)
    k_cache, v_cache = torch.zeros(2, 32, 2, 16), torch.zeros(2, 32, 2, 16)

    def decode(q, position):
        return flash4.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=position, causal=True)

    calls = [(torch.randn(2, 1, 4, 16), position) for position in range(2, 14)]
    k_cache.normal_(), v_cache.normal_()
    assert _frames_for(decode, calls) <= 2


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen_sink"])
def test_compiled_autograd_traces_the_eager_backward(varlen):
    # Compiled autograd (torchtitan's option next to FSDP2) traces the backward of a forward that ran eagerly:
    # the eager shortcut's backward must reach the library through the custom op, not a call Dynamo cannot trace.
    torch.manual_seed(0)
    q, k, v = (torch.randn(10, 4, 32, requires_grad=True) for _ in range(3))
    sink = torch.zeros(4, requires_grad=True)
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)

    def loss():
        if varlen:
            out = flash4.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True, learnable_sink=sink)
        else:
            out = flash4.flash_attn_func(q[None], k[None], v[None], causal=True)
        return out.square().sum()

    loss().backward()
    expected = [t.grad.clone() for t in (q, k, v, sink) if t.grad is not None]
    for t in (q, k, v, sink):
        t.grad = None
    torch._dynamo.reset()
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager", fullgraph=True)):
        loss().backward()
    got = [t.grad for t in (q, k, v, sink) if t.grad is not None]
    assert len(got) == len(expected) == (4 if varlen else 3)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)

"""flash4 with torch tensors in the layouts users hand it: views into a fused projection, transposed storage,
a non-contiguous head dim, broadcast (stride-0) views, row strides and start addresses that TMA cannot address
(copied on the GPU, tested with the helper on any machine), and broadcast upstream gradients. Every layout gives
the contiguous inputs' results."""

import pytest

torch = pytest.importorskip("torch")

import flash4  # noqa: E402
from torch_devices import DEVICES  # noqa: E402
from flash4._torch_ops import _gpu_layout, _tma_addressable  # noqa: E402


def _offset_view(t, elements):
    """t's values in storage that starts `elements` elements past an allocation's (16-byte aligned) start."""
    flat = torch.empty(t.numel() + elements, dtype=t.dtype, device=t.device)
    view = flat[elements:].view(t.shape)
    return view.copy_(t)


def _padded_rows(t, width):
    """t's values in rows of `width` elements (head dims padded), seen through a slice."""
    wide = torch.zeros(*t.shape[:-1], width, dtype=t.dtype, device=t.device)
    wide[..., : t.shape[-1]] = t
    return wide[..., : t.shape[-1]]


def test_tma_addressable_rule():
    x = torch.randn(2, 5, 3, 64, dtype=torch.bfloat16)
    assert _tma_addressable(x)
    assert not _tma_addressable(torch.randn(1, 5, 3, 64).expand(4, 5, 3, 64))  # stride 0
    assert not _tma_addressable(_padded_rows(x, 68))  # 136-byte rows
    assert _tma_addressable(_padded_rows(x, 72))  # 144-byte rows
    assert not _tma_addressable(_offset_view(x, 1))  # starts 2 bytes past an aligned address
    assert _tma_addressable(_offset_view(x, 8))
    assert not _tma_addressable(torch.randn(2, 5, 3, 64, dtype=torch.float32)[:, :, :, 2:])  # misaligned start


def test_gpu_layout_keeps_cpu_tensors():
    # The CPU path takes any strides but a non-unit one in the last dimension: no copies there.
    x = torch.randn(1, 5, 3, 64).expand(4, 5, 3, 64)
    assert _gpu_layout(x) is x
    y = torch.randn(2, 64, 5, 3).permute(0, 2, 3, 1)
    assert _gpu_layout(y).stride(-1) == 1 and torch.equal(_gpu_layout(y), y)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_layouts_match_contiguous(device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    batch, seqlen, heads, heads_kv, dim = 2, 45, 4, 2, 64
    packed = torch.randn(batch, seqlen, heads + 2 * heads_kv, dim, device=device, dtype=dtype)
    dout = torch.randn(batch, seqlen, heads, dim, device=device, dtype=dtype)

    def run(make):
        leaf = packed.clone().requires_grad_()
        q, k, v = make(leaf)
        out = flash4.flash_attn_func(q, k, v, causal=True)
        out.backward(dout)
        return out, leaf.grad

    def views(t):  # q, k, v as views into one packed projection, as in a fused qkv layer
        return t.split([heads, heads_kv, heads_kv], dim=2)

    def contiguous(t):
        return [x.contiguous() for x in views(t)]

    def sdpa_layout(t):  # (batch, heads, seqlen, dim) storage seen through transposes
        return [x.transpose(1, 2).contiguous().transpose(1, 2) for x in views(t)]

    def last_dim_strided(t):  # head_dim not contiguous: flash4 copies it
        return [x.transpose(1, 3).contiguous().transpose(1, 3) for x in views(t)]

    def padded_rows(t):  # 68-element rows: 136 bytes, which TMA cannot stride over (copied on the GPU)
        return [_padded_rows(x, 68) for x in views(t)]

    def offset_start(t):  # storage starting 2 bytes (bf16) or 4 bytes (fp32) past an aligned address
        return [_offset_view(x, 1) for x in views(t)]

    expected_out, expected_grad = run(contiguous)
    for make in (views, sdpa_layout, last_dim_strided, padded_rows, offset_start):
        out, grad = run(make)
        assert torch.equal(out, expected_out), make.__name__
        tol = 1e-6 if dtype == torch.float32 else 2e-2  # GPU gradients may be summed in a different order
        assert torch.allclose(grad, expected_grad, rtol=tol, atol=tol), make.__name__


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_keys_match_repeated(device):
    # k and v shared by every batch entry (batch stride 0), the same values as the repeated tensors.
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(1)
    q = torch.randn(3, 40, 4, 64, device=device, dtype=dtype)
    k1, v1 = (torch.randn(1, 70, 2, 64, device=device, dtype=dtype) for _ in range(2))
    dout = torch.randn(3, 40, 4, 64, device=device, dtype=dtype)

    def run(k, v):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k1, v1)]
        kk, vv = k(leaves[1]), v(leaves[2])
        out = flash4.flash_attn_func(leaves[0], kk, vv, causal=True)
        out.backward(dout)
        return out, [t.grad for t in leaves]

    out_b, grads_b = run(lambda t: t.expand(3, -1, -1, -1), lambda t: t.expand(3, -1, -1, -1))
    out_r, grads_r = run(lambda t: t.repeat(3, 1, 1, 1), lambda t: t.repeat(3, 1, 1, 1))
    assert torch.equal(out_b, out_r)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    for g_b, g_r in zip(grads_b, grads_r):
        assert torch.allclose(g_b, g_r, rtol=tol, atol=tol)


def test_broadcast_upstream_gradient():
    # out.sum() hands backward a gradient with stride 0 everywhere; it must be made contiguous, not rejected.
    q = torch.randn(1, 16, 2, 64, dtype=torch.float32, requires_grad=True)
    flash4.flash_attn_func(q, q, q).sum().backward()
    assert torch.isfinite(q.grad).all()


def test_broadcast_outputs_are_refused():
    # An output whose elements share memory (expand) would have every batch entry write the same rows.
    q = torch.randn(2, 9, 4, 16)
    k = v = torch.randn(2, 11, 2, 16)
    out = torch.empty(1, 9, 4, 16).expand(2, 9, 4, 16)
    with pytest.raises(ValueError, match=r"out.stride\[0\] = 0 with out.shape\[0\] = 2"):
        flash4.forward(q, k, v, out)
    out, lse = flash4.flash_attn_func(q, k, v, return_lse=True)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    grads[1] = torch.empty(2, 1, 2, 16).expand(2, 11, 2, 16)
    with pytest.raises(ValueError, match=r"dk.stride\[1\] = 0 with dk.shape\[1\] = 11"):
        flash4.backward(torch.ones_like(out), q, k, v, out, lse, *grads)

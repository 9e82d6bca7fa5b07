"""Head dims 96 and 192 and v / out with a head dim of their own (head_dim_v != head_dim, e.g. DeepSeek's (192, 128)):
flash_attn_func and flash_attn_varlen_func infer it from v's shape; forward, lse and gradients against the fp64
reference with the tolerance rule (CPU), the custom ops' fake implementations (opcheck, torch.compile), numpy
arrays, and on a Hopper GPU (which has 96 and 192 kernels, forward and backward, and runs the others zero-padded
on its 96 / 128 / 192 / 256 kernels, also head dims such as 80 and 136) the same checks and the clear refusal of
the splits it does not take."""

import numpy as np
import pytest

import flash4
from attention_reference import attention, check_tolerance

# (head_dim, head_dim_v)
DIMS = [(96, 96), (192, 192), (192, 128), (128, 64)]
DIM_IDS = [f"d{d}-dv{dv}" for d, dv in DIMS]


def test_numpy_split_head_dims():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 33, 4, 192)).astype(np.float32)
    k = rng.standard_normal((2, 40, 2, 192)).astype(np.float32)
    v = rng.standard_normal((2, 40, 2, 128)).astype(np.float32)
    out, lse = flash4.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.shape == (2, 33, 4, 128) and lse.shape == (2, 4, 33)
    ref_out, ref_lse = attention(q, k, v, causal=True)  # default scale 1/sqrt(192): q.k's width
    naive_out, naive_lse = attention(q, k, v, causal=True, round_to=np.float32)
    check_tolerance("out", out, ref_out, naive_out, "float32")
    check_tolerance("lse", lse, ref_lse, naive_lse, "float32")


def test_numpy_out_of_the_wrong_head_dim_is_rejected():
    q = np.zeros((1, 8, 2, 128), np.float32)
    v = np.zeros((1, 8, 2, 64), np.float32)
    with pytest.raises(ValueError, match=r"out.shape\[3\] \(head_dim\) = 128 but v.shape\[3\] = 64"):
        flash4.forward(q, q, v, np.empty_like(q))
    assert flash4.can_implement(q, q, v)  # the CPU runs split head dims


torch = pytest.importorskip("torch")

from test_torch import Case, hopper_present  # noqa: E402
from test_varlen import VarlenCase  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("mask", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (False, (8, 2), 5.0)],
                         ids=["full", "causal", "window-softcap"])
@pytest.mark.parametrize("dims", DIMS, ids=DIM_IDS)
def test_torch_forward_backward(dims, mask, dtype):
    d, dv = dims
    Case((2, 37, 45, 4, 2, d), mask, dtype, "cpu", seed=d + dv, dim_v=dv).check(backward=True)


@pytest.mark.parametrize("dims", DIMS, ids=DIM_IDS)
def test_torch_varlen_with_sink(dims):
    d, dv = dims
    VarlenCase([9, 0, 30], [12, 5, 30], 4, 2, d, torch.bfloat16, "cpu", causal=True, sink=True, pad_q=2,
               seed=d, dim_v=dv).check()


def test_opcheck_split_head_dims():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 17, 4, 192), torch.randn(1, 23, 2, 192), torch.randn(1, 23, 2, 128)
    torch.library.opcheck(torch.ops.flash4.fwd.default, (q, k, v, 0.0, True, -1, -1, 0.0, False))
    out, lse = torch.ops.flash4.fwd(q, k, v, 0.0, True, -1, -1, 0.0, False)
    assert out.shape == (1, 17, 4, 128)
    torch.library.opcheck(torch.ops.flash4.bwd.default,
                          (torch.randn_like(out), q, k, v, out, lse, 0.0, True, -1, -1, 0.0, False))


def test_compile_fullgraph_split_head_dims():
    torch.manual_seed(0)
    leaves = [torch.randn(2, 19, 4, d, requires_grad=True) for d in (128, 128, 64)]

    def loss(q, k, v):
        return flash4.flash_attn_func(q, k, v, causal=True).square().sum()

    loss(*leaves).backward()
    eager = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    torch._dynamo.reset()
    torch.compile(loss, fullgraph=True)(*leaves).backward()  # the fake impls give out and dv v's head dim
    for g, e in zip((t.grad for t in leaves), eager):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dims", DIMS, ids=DIM_IDS)
def test_cuda_forward_backward(dims, causal):
    """The GPU runs these pairs on its 192 kernels or zero-padded on its 128 / 192 kernels (head_dims.h)."""
    d, dv = dims
    Case((2, 77, 130, 4, 2, d), (causal, (-1, -1), 0.0), torch.bfloat16, "cuda", seed=d + dv,
         dim_v=dv).check(backward=True)
    VarlenCase([9, 0, 70], [12, 5, 90], 4, 2, d, torch.float16, "cuda", causal=causal, seed=d, dim_v=dv).check()


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("d", [80, 136])
def test_cuda_other_multiples_of_8(d):
    """Head dims without a kernel of their own run zero-padded on the next wider one."""
    Case((2, 77, 130, 4, 2, d), (True, (-1, -1), 0.0), torch.bfloat16, "cuda", seed=d).check(backward=True)


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("dims", [(80, 64), (192, 64)], ids=["d80-dv64", "d192-dv64"])
def test_cuda_refuses_what_the_kernels_do_not_take(dims):
    d, dv = dims
    reason = "(192, 128) or (128, 64)"
    q = torch.zeros(1, 64, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.zeros(1, 64, 2, dv, device="cuda", dtype=torch.bfloat16)
    for backward in (False, True):
        support = flash4.can_implement(q, q, v, backward=backward)
        assert not support and reason in support.reason, support.reason
    with pytest.raises(NotImplementedError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        flash4.flash_attn_func(q, q, v)

"""flash4.distributed's computation without process groups, on the CPU and on a Hopper GPU: a ring of W ranks
simulated by W threads of one process (their exchanges through queues) runs the real ring_forward and
ring_backward, so the GPU path of every block (trimmed window blocks, LSE merge, dK/dV accumulation) is tested
on the one GPU that NCCL would need W of. Plus the NCCL path in a 1-rank group and its time against the plain
call (overhead <= 3 %)."""

import queue
import threading
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import flash4  # noqa: E402
from torch_devices import hopper_present, CUDA  # noqa: E402
import flash4.distributed as f4d  # noqa: E402
from attention_reference import allowed_keys, check_tolerance  # noqa: E402
from flash4.distributed._ring_attention import ring_backward, ring_forward, shard_plans  # noqa: E402
from flash4.distributed._ring_comm import make_ring  # noqa: E402


class ThreadRing:
    """A ring of world_size ranks that are threads of this process: the interface of _ring_comm.Ring."""

    def __init__(self, rank, world_size, mailboxes):
        self.rank, self.world_size, self._mailboxes = rank, world_size, mailboxes

    def start_exchange(self, tensors, tag):
        self._mailboxes[(self.rank + 1) % self.world_size, tag].put([t.clone() for t in tensors])
        return _Pending(self._mailboxes[self.rank, tag])


class _Pending:
    def __init__(self, mailbox):
        self._mailbox = mailbox

    def wait(self):
        return self._mailbox.get(timeout=120)


def run_thread_ring(q, k, v, dout, world_size, layout, options):
    """(out, lse, dq, dk, dv) of the unsharded sequence, computed by a ring of world_size threads."""
    mailboxes = {(r, tag): queue.Queue() for r in range(world_size) for tag in (0, 1)}
    results, errors = [None] * world_size, []
    scale = q.shape[-1] ** -0.5
    causal, (left, right), softcap = options["causal"], options["window_size"], options["softcap"]

    def rank_main(rank):
        try:
            ring = ThreadRing(rank, world_size, mailboxes)
            shard = [f4d.shard_sequence_for_rank(t, rank, world_size, layout) for t in (q, k, v, dout)]
            plans = shard_plans(ring, layout, shard[0].shape[1], causal, left, right)
            out, lse = ring_forward(*shard[:3], ring, plans, scale, softcap, False)
            grads = ring_backward(shard[3], *shard[:3], out, lse, ring, plans, scale, softcap, False)
            if q.is_cuda:
                torch.cuda.synchronize()
            results[rank] = (out, lse, *grads)
        except Exception as error:  # noqa: BLE001 (re-raised by the test)
            errors.append(error)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    if errors:
        raise errors[0]
    assert all(r is not None for r in results), "a ring thread did not finish"
    return tuple(f4d.unshard_from_shards([r[n] for r in results], layout, dim=2 if n == 1 else 1)
                 for n in range(5))


def naive_attention(q, k, v, causal, window, softcap, dtype):
    """Plain attention in `dtype` (float64: the reference; bf16: the naive same-dtype baseline, every
    materialized intermediate rounded), differentiable; (out, lse)."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    group = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * q.shape[-1] ** -0.5
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    mask = torch.from_numpy(allowed_keys(q.shape[1], k.shape[1], causal, window)).to(q.device)
    s = s.masked_fill(~mask, float("-inf"))
    wide = s.double() if dtype == torch.float64 else s.float()  # the softmax's own precision
    lse = torch.logsumexp(wide, dim=-1)
    p = torch.softmax(wide, dim=-1).to(dtype)
    return torch.einsum("bhqk,bkhd->bqhd", p, vv), lse


def _with_grads(fn, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = fn(q, k, v)
    out.backward(dout.to(out.dtype))
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


# (world_size, layout, seqlen, heads, heads_kv, head_dim, causal, window, softcap)
CASES = [
    (2, "zigzag", 256, 4, 2, 64, True, (-1, -1), 0.0),
    (4, "zigzag", 512, 4, 1, 128, True, (100, -1), 0.0),
    (3, "contiguous", 384, 2, 2, 64, False, (70, 45), 0.0),
    (4, "zigzag", 256, 2, 2, 128, False, (-1, -1), 30.0),
    (3, "zigzag", 384, 4, 2, 64, True, (-1, -1), 0.0),
]


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"w{c[0]}-{c[1]}-s{c[2]}-d{c[5]}-c{int(c[6])}-win{c[7][0]}")
def test_thread_ring_bf16_within_tolerance(device, case):
    world_size, layout, seqlen, heads, heads_kv, head_dim, causal, window, softcap = case
    g = torch.Generator().manual_seed(seqlen + head_dim)
    shapes = [(1, seqlen, heads, head_dim), (1, seqlen, heads_kv, head_dim), (1, seqlen, heads_kv, head_dim),
              (1, seqlen, heads, head_dim)]
    q, k, v, dout = (torch.randn(s, generator=g).to(torch.bfloat16).to(device) for s in shapes)
    options = dict(causal=causal, window_size=window, softcap=softcap)
    ring = run_thread_ring(q, k, v, dout, world_size, layout, options)
    ref = _with_grads(lambda *t: naive_attention(*t, causal, window, softcap, torch.float64), q, k, v, dout)
    naive = _with_grads(lambda *t: naive_attention(*t, causal, window, softcap, torch.bfloat16), q, k, v, dout)
    single = _with_grads(lambda *t: flash4.flash_attn_func(*t, return_lse=True, **options), q, k, v, dout)
    for n, name in enumerate(("out", "lse", "dq", "dk", "dv")):
        def np64(t):
            return t.double().cpu().numpy()
        dtype_name = "float32" if name == "lse" else "bfloat16"
        check_tolerance(f"ring {name}", np64(ring[n]), np64(ref[n]), np64(naive[n]), dtype_name)
        # The single-process call passes the same rule: the rule is the one its own tests use.
        check_tolerance(f"single {name}", np64(single[n]), np64(ref[n]), np64(naive[n]), dtype_name)


def test_thread_ring_fp32_equals_the_single_call():
    g = torch.Generator().manual_seed(5)
    q, k, v, dout = (torch.randn(2, 96, 4, 32, generator=g) for _ in range(4))
    options = dict(causal=True, window_size=(20, -1), softcap=0.0)
    ring = run_thread_ring(q, k, v, dout, 4, "zigzag", options)
    single = _with_grads(lambda *t: flash4.flash_attn_func(*t, return_lse=True, **options), q, k, v, dout)
    for got, want in zip(ring, single):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---- NCCL, one rank ----------------------------------------------------------------------------------------


@pytest.fixture
def nccl_one_rank_group():
    if not dist.is_nccl_available():
        pytest.skip("torch.distributed has no NCCL")
    assert not dist.is_initialized()
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _median_ms(fn, iters):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
def test_cuda_nccl_one_rank_equals_the_plain_call_and_costs_at_most_3_percent(nccl_one_rank_group):
    group = nccl_one_rank_group
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, 16384, 16, 128)
    q, k, v, dout = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def ring_step():
        out = f4d.ring_flash_attn_func(q, k, v, group, causal=True, deterministic=True)
        return out, torch.autograd.grad(out, (q, k, v), dout)

    def plain_step():
        out = flash4.flash_attn_func(q, k, v, causal=True, deterministic=True)
        return out, torch.autograd.grad(out, (q, k, v), dout)

    (out_r, grads_r), (out_p, grads_p) = ring_step(), plain_step()
    assert torch.equal(out_r, out_p) and all(torch.equal(a, b) for a, b in zip(grads_r, grads_p))
    # Interleaved medians (clock and power drift hit both alike).
    ring_ms, plain_ms = [], []
    for _ in range(3):
        ring_ms.append(_median_ms(ring_step, 10))
        plain_ms.append(_median_ms(plain_step, 10))
    ratio = min(ring_ms) / min(plain_ms)
    print(f"1-rank NCCL ring fwd+bwd {min(ring_ms):.3f} ms, plain {min(plain_ms):.3f} ms, ratio {ratio:.4f}")
    assert ratio <= 1.03, f"ring in a 1-rank group {min(ring_ms):.3f} ms vs plain {min(plain_ms):.3f} ms"


@pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU")
def test_cuda_nccl_one_rank_general_ring_path(nccl_one_rank_group):
    """The ring's general path (block plan, LSE merge, float32 accumulators, NCCL exchange of dK/dV with itself)
    on a 1-rank group, which ring_flash_attn_func short-cuts to the plain call: bit-identical to the plain call
    (one block, merged with weight exp(0) = 1, accumulated in float32 from bf16). Its time is printed: the
    cost of the merge and accumulators at one rank."""
    ring = make_ring(nccl_one_rank_group, None, "test")
    g = torch.Generator(device="cuda").manual_seed(1)
    shape = (1, 8192, 16, 128)
    q, k, v, dout = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = 128 ** -0.5
    plans = shard_plans(ring, "contiguous", shape[1], True, -1, -1)
    assert len(plans) == 1 and len(plans[0]) == 1 and plans[0][0].window_right == 0

    def general():
        out, lse = ring_forward(q, k, v, ring, plans, scale, 0.0, True)
        return (out, lse) + ring_backward(dout, q, k, v, out, lse, ring, plans, scale, 0.0, True)

    def plain():
        out, lse = torch.ops.flash4.fwd(q, k, v, scale, True, -1, -1, 0.0, False)
        return (out, lse) + tuple(torch.ops.flash4.bwd(dout, q, k, v, out, lse, scale, True, -1, -1, 0.0, True))[:3]

    got, want = general(), plain()
    torch.cuda.synchronize()
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert torch.equal(a, b), f"{name} differs from the plain call"
    general_ms, plain_ms = _median_ms(general, 10), _median_ms(plain, 10)
    print(f"1-rank NCCL general ring path fwd+bwd {general_ms:.3f} ms, plain ops {plain_ms:.3f} ms, "
          f"ratio {general_ms / plain_ms:.4f}")

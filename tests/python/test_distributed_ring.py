"""flash4.distributed.ring_flash_attn_func in spawned gloo process groups of 2, 3 and 4 ranks on the CPU:
outputs, LSE and gradients equal to the single-process flash4 call on the unsharded sequence (causal and not,
windows, softcap, GQA/MQA, both layouts), deterministic runs bit-identical, bf16 within the tolerance rule, and
errors: ranks that disagree raise the same ValueError on every rank, a rank that never joins makes the others
raise within the timeout."""

import datetime
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import flash4  # noqa: E402
import flash4.distributed as f4d  # noqa: E402
from attention_reference import attention, check_tolerance  # noqa: E402
from distributed_harness import run_on_ranks, values_or_fail  # noqa: E402

# (name, layout, heads, heads_kv, head_dim, causal, window, softcap)
CASES = [
    ("full", "contiguous", 4, 4, 16, False, (-1, -1), 0.0),
    ("full-zigzag-gqa", "zigzag", 4, 2, 16, False, (-1, -1), 0.0),
    ("causal", "contiguous", 4, 4, 16, True, (-1, -1), 0.0),
    ("causal-zigzag", "zigzag", 4, 4, 32, True, (-1, -1), 0.0),
    ("causal-zigzag-mqa", "zigzag", 4, 1, 16, True, (-1, -1), 0.0),
    ("window-5-3", "contiguous", 2, 2, 16, False, (5, 3), 0.0),
    ("window-5-3-zigzag", "zigzag", 2, 2, 16, False, (5, 3), 0.0),
    ("causal-window-7-zigzag-gqa", "zigzag", 4, 2, 16, True, (7, -1), 0.0),
    ("causal-window-3-contiguous", "contiguous", 2, 1, 16, True, (3, -1), 0.0),
    ("window-right-only-zigzag", "zigzag", 2, 2, 16, False, (-1, 4), 0.0),
    ("wide-window-zigzag", "zigzag", 2, 2, 16, False, (13, 11), 0.0),
    ("causal-softcap-zigzag", "zigzag", 2, 2, 16, True, (-1, -1), 5.0),
]
LOCAL_SEQLEN = 10
BATCH = 2


def _inputs(seed, seqlen, heads, heads_kv, head_dim, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, seqlen, heads, head_dim, generator=g).to(dtype)
    k = torch.randn(BATCH, seqlen, heads_kv, head_dim, generator=g).to(dtype)
    v = torch.randn(BATCH, seqlen, heads_kv, head_dim, generator=g).to(dtype)
    dout = torch.randn(BATCH, seqlen, heads, head_dim, generator=g).to(dtype)
    return q, k, v, dout


def _ring(q, k, v, dout, layout, **options):
    """(out, lse, dq, dk, dv) of the ring on this rank's shards of the full tensors."""
    q, k, v, dout = (f4d.shard_sequence(t, layout=layout) for t in (q, k, v, dout))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = f4d.ring_flash_attn_func(q, k, v, layout=layout, return_lse=True, **options)
    out.backward(dout)
    return out.detach(), lse, q.grad, k.grad, v.grad


def _single(q, k, v, dout, **options):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = flash4.flash_attn_func(q, k, v, return_lse=True, **options)
    out.backward(dout)
    return out.detach(), lse, q.grad, k.grad, v.grad


def _shard_of_single(single, layout, rank, world_size):
    out, lse, dq, dk, dv = single
    return tuple(f4d.shard_sequence_for_rank(t, rank, world_size, layout, dim=2 if n == 1 else 1)
                 for n, t in enumerate((out, lse, dq, dk, dv)))


def check_cases(rank, world_size):
    """Every case of CASES on this rank: the ring equals the single-process call within fp32 rounding."""
    worst = {}
    for n, (name, layout, heads, heads_kv, head_dim, causal, window, softcap) in enumerate(CASES):
        seqlen = LOCAL_SEQLEN * world_size
        q, k, v, dout = _inputs(100 + n, seqlen, heads, heads_kv, head_dim)
        options = dict(causal=causal, window_size=window, softcap=softcap)
        ring = _ring(q, k, v, dout, layout, **options)
        expected = _shard_of_single(_single(q, k, v, dout, **options), layout, rank, world_size)
        for what, got, want in zip(("out", "lse", "dq", "dk", "dv"), ring, expected):
            assert got.shape == want.shape and got.dtype == want.dtype, (name, what, got.shape, want.shape)
            scale = max(float(want.abs().max()), 1.0)
            error = float((got - want).abs().max())
            worst[what] = max(worst.get(what, 0.0), error / scale)
            # fp32 rounding of another summation order over <= 4 ring blocks (measured: <= 1.3e-6 relative).
            assert error <= 1e-5 * scale, f"{name}: {what} differs by {error:.3g} (max |ref| {scale:.3g})"
    return worst


def check_deterministic_and_bf16(rank, world_size):
    seqlen = LOCAL_SEQLEN * world_size
    # Deterministic: two runs are bit-identical (the merge and accumulation orders are fixed by the ring).
    q, k, v, dout = _inputs(7, seqlen, 4, 2, 16)
    options = dict(causal=True, window_size=(6, -1), deterministic=True)
    first = _ring(q, k, v, dout, "zigzag", **options)
    second = _ring(q, k, v, dout, "zigzag", **options)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    # bf16 against the fp64 reference: within twice the single-process flash4 call's own error plus atol.
    q, k, v, dout = _inputs(8, seqlen, 4, 2, 32, dtype=torch.bfloat16)
    options = dict(causal=True)
    single = _shard_of_single(tuple(t.float() for t in _single(q, k, v, dout, **options)), "zigzag", rank,
                              world_size)
    got = _ring(q, k, v, dout, "zigzag", **options)
    ref_out, ref_lse = attention(*(t.float().numpy() for t in (q, k, v)), causal=True)
    ours = f4d.shard_sequence_for_rank(torch.from_numpy(ref_out), rank, world_size, "zigzag")
    ours_lse = f4d.shard_sequence_for_rank(torch.from_numpy(ref_lse), rank, world_size, "zigzag", dim=2)
    check_tolerance("ring out", got[0].double().numpy(), ours.numpy(), single[0].double().numpy(), "bfloat16")
    check_tolerance("ring lse", got[1].double().numpy(), ours_lse.numpy(), single[1].double().numpy(), "float32")
    # Without return_lse the ring returns the output alone, like flash_attn_func.
    plain = f4d.ring_flash_attn_func(*(f4d.shard_sequence(t) for t in (q, k, v)), causal=True)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, got[0])
    return True


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_equals_single_process(world_size, tmp_path):
    worst = values_or_fail(run_on_ranks(check_cases, world_size, tmp_path))
    assert len(worst) == world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_ring_deterministic_and_bf16(world_size, tmp_path):
    values_or_fail(run_on_ranks(check_deterministic_and_bf16, world_size, tmp_path))


# ---- errors ----------------------------------------------------------------------------------------------


def mismatched_calls(rank, world_size):
    """Calls in which the ranks disagree; returns the message each raised (all ranks must raise)."""
    messages = []
    base = dict(heads=2, head_dim=16)

    def shards(seqlen, dtype=torch.float32):
        q = torch.randn(1, seqlen, base["heads"], base["head_dim"], dtype=dtype)
        return q, q.clone(), q.clone()

    scenarios = [
        (shards(8 if rank != 1 else 6), {}),  # another local sequence length on rank 1
        (shards(8, torch.float64 if rank == world_size - 1 else torch.float32), {}),  # another dtype
        (shards(8), {"causal": rank == 0}),  # another option
        (shards(8), {"window_size": (4, -1) if rank == 0 else (5, -1)}),
        (shards(7), {}),  # the same on every rank, but zigzag needs an even local length
    ]
    for (q, k, v), options in scenarios:
        start = time.monotonic()
        try:
            f4d.ring_flash_attn_func(q, k, v, layout="zigzag", timeout=20, **options)
        except ValueError as error:
            messages.append((str(error), time.monotonic() - start))
        else:
            messages.append((None, time.monotonic() - start))
    return messages


def test_mismatched_ranks_raise_on_every_rank(tmp_path):
    values = values_or_fail(run_on_ranks(mismatched_calls, 3, tmp_path))
    expected = ["disagree on q.shape[1] (rank 0: 8, rank 1: 6, rank 2: 8)",
                "disagree on q.dtype (rank 0: torch.float32, rank 1: torch.float32, rank 2: torch.float64)",
                "disagree on causal (rank 0: 1, rank 1: 0, rank 2: 0)",
                "disagree on window_left (rank 0: 4, rank 1: 5, rank 2: 5)",
                "layout 'zigzag' needs a local sequence length divisible by 2, got q.shape[1] = 7"]
    for rank, messages in values.items():
        for want, (message, seconds) in zip(expected, messages):
            assert message is not None, f"rank {rank}: no error for '{want}'"
            assert want in message, f"rank {rank}: {message!r} lacks {want!r}"
            assert seconds < 20, f"rank {rank}: the error took {seconds:.1f} s"


def missing_rank(rank, world_size):
    """Rank 1 never calls; rank 0 must raise within its 3 s timeout instead of waiting forever."""
    if rank == 1:
        time.sleep(8)  # stays in the group (alive) without calling
        return None
    q = torch.randn(1, 8, 2, 16)
    start = time.monotonic()
    try:
        f4d.ring_flash_attn_func(q, q, q, timeout=datetime.timedelta(seconds=3))
    except RuntimeError as error:
        return (type(error).__name__, str(error)[:300], time.monotonic() - start)
    return ("no error", "", time.monotonic() - start)


def test_missing_rank_times_out(tmp_path):
    values = values_or_fail(run_on_ranks(missing_rank, 2, tmp_path, group_timeout_s=60))
    name, message, seconds = values[0]
    assert name != "no error", "rank 0 returned although rank 1 never called"
    assert 2.5 <= seconds < 15, f"rank 0 raised after {seconds:.1f} s ({name}: {message})"


def test_no_process_group_is_a_clear_error():
    assert not dist.is_initialized()
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized; call torch.distributed."
                                           "init_process_group"):
        f4d.ring_flash_attn_func(q, q, q)


def test_one_rank_group_is_the_plain_call(tmp_path):
    values = values_or_fail(run_on_ranks(one_rank, 1, tmp_path))
    assert values[0] is True


def one_rank(rank, world_size):
    q, k, v, dout = _inputs(3, 16, 4, 2, 16)
    for layout in ("contiguous", "zigzag"):
        ring = _ring(q, k, v, dout, layout, causal=True, window_size=(5, -1))
        single = _single(q, k, v, dout, causal=True, window_size=(5, -1))
        for a, b in zip(ring, single):
            assert torch.equal(a, b)
    return True


def test_reference_inputs_are_not_trivial():
    """The cases' inputs give attention with visible differences between rows (a test that cannot fail
    otherwise: all-equal rows would make any row permutation pass)."""
    q, k, v, _ = _inputs(100, LOCAL_SEQLEN * 2, 4, 4, 16)
    out = flash4.flash_attn_func(q, k, v, causal=True)
    assert float((out[:, 1:] - out[:, :-1]).abs().max()) > 0.1
    assert np.isfinite(out.numpy()).all()

"""flash4.distributed.ring_flash_attn_func in spawned gloo process groups of 2, 3 and 4 ranks on the CPU:
outputs, LSE and gradients equal to the single-process flash4 call on the unsharded sequence (causal and not,
windows, softcap, GQA/MQA, both layouts), deterministic runs bit-identical, bf16 within the tolerance rule, and
errors: ranks that disagree raise the same ValueError on every rank, a rank that never joins makes the others
raise within the timeout."""

import datetime
import time
import traceback

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


def _ring(group, q, k, v, dout, layout, **options):
    """(out, lse, dq, dk, dv) of the ring on this rank's shards of the full tensors."""
    q, k, v, dout = (f4d.shard_sequence(t, group, layout=layout) for t in (q, k, v, dout))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = f4d.ring_flash_attn_func(q, k, v, group, layout=layout, return_lse=True, **options)
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


def check_cases(group):
    """Every case of CASES: the ring equals the single-process call within fp32 rounding. Failures are
    collected and raised after the last case, so that every rank makes every ring call (no rank stalls its
    peers)."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    worst, failures = {}, []
    for n, (name, layout, heads, heads_kv, head_dim, causal, window, softcap) in enumerate(CASES):
        seqlen = LOCAL_SEQLEN * world_size
        q, k, v, dout = _inputs(100 + n, seqlen, heads, heads_kv, head_dim)
        options = dict(causal=causal, window_size=window, softcap=softcap)
        ring = _ring(group, q, k, v, dout, layout, **options)
        expected = _shard_of_single(_single(q, k, v, dout, **options), layout, rank, world_size)
        for what, got, want in zip(("out", "lse", "dq", "dk", "dv"), ring, expected):
            if got.shape != want.shape or got.dtype != want.dtype:
                failures.append(f"{name}: {what} is {got.dtype} {tuple(got.shape)}, want {want.dtype} "
                                f"{tuple(want.shape)}")
                continue
            scale = max(float(want.abs().max()), 1.0)
            error = float((got - want).abs().max())
            worst[what] = max(worst.get(what, 0.0), error / scale)
            # fp32 rounding of another summation order over <= 4 ring blocks (measured: <= 1.3e-6 relative).
            if not error <= 1e-5 * scale:
                failures.append(f"{name}: {what} differs by {error:.3g} (max |ref| {scale:.3g})")
    assert not failures, "\n".join(failures)
    return worst


def check_deterministic_and_bf16(group):
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    seqlen = LOCAL_SEQLEN * world_size
    # Deterministic: two runs are bit-identical (the merge and accumulation orders are fixed by the ring).
    q, k, v, dout = _inputs(7, seqlen, 4, 2, 16)
    options = dict(causal=True, window_size=(6, -1), deterministic=True)
    first = _ring(group, q, k, v, dout, "zigzag", **options)
    second = _ring(group, q, k, v, dout, "zigzag", **options)
    identical = [torch.equal(a, b) for a, b in zip(first, second)]
    # bf16 against the fp64 reference: within twice the single-process flash4 call's own error plus atol.
    q, k, v, dout = _inputs(8, seqlen, 4, 2, 32, dtype=torch.bfloat16)
    single = _shard_of_single(tuple(t.float() for t in _single(q, k, v, dout, causal=True)), "zigzag", rank,
                              world_size)
    got = _ring(group, q, k, v, dout, "zigzag", causal=True)
    # Without return_lse the ring returns the output alone, like flash_attn_func.
    plain = f4d.ring_flash_attn_func(*(f4d.shard_sequence(t, group) for t in (q, k, v)), group, causal=True)
    assert all(identical), f"deterministic runs differ in (out, lse, dq, dk, dv): {identical}"
    ref_out, ref_lse = attention(*(t.float().numpy() for t in (q, k, v)), causal=True)
    ref_out = f4d.shard_sequence_for_rank(torch.from_numpy(ref_out), rank, world_size, "zigzag")
    ref_lse = f4d.shard_sequence_for_rank(torch.from_numpy(ref_lse), rank, world_size, "zigzag", dim=2)
    check_tolerance("ring out", got[0].double().numpy(), ref_out.numpy(), single[0].double().numpy(), "bfloat16")
    check_tolerance("ring lse", got[1].double().numpy(), ref_lse.numpy(), single[1].double().numpy(), "float32")
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, got[0])
    return True


def mismatched_calls(group):
    """Calls in which the ranks disagree; returns (message, seconds) of the ValueError each raised."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    messages = []

    def shards(seqlen, dtype=torch.float32):
        q = torch.randn(1, seqlen, 2, 16, dtype=dtype)
        return q, q.clone(), q.clone()

    scenarios = [
        (shards(8 if rank != 1 else 6), {}),  # another local sequence length on rank 1
        (shards(8, torch.float64 if rank == world_size - 1 else torch.float32), {}),  # another dtype
        (shards(8), {"causal": rank == 0}),  # another option
        (shards(8), {"window_size": (4, -1) if rank == 0 else (5, -1)}),
        (shards(7), {}),  # the same on every rank, but zigzag needs an even local length
        ((shards(8)[0], shards(8)[1][..., :8], shards(8)[2]), {}),  # k's head dim is not q's (on every rank)
        ((shards(8)[0], shards(8)[1][:, :, :1], shards(8)[2]), {}),  # v has more heads than k
    ]
    for (q, k, v), options in scenarios:
        start = time.monotonic()
        try:
            f4d.ring_flash_attn_func(q, k, v, group, layout="zigzag", timeout=20, **options)
        except ValueError as error:
            messages.append((str(error), time.monotonic() - start))
        else:
            messages.append((None, time.monotonic() - start))
    return messages


def noncontiguous_and_library_errors(group):
    """q whose last dimension is not contiguous (the plain call copies it) equals the single-process call; a call
    the library refuses on every rank mid-ring (softcap < 0 passes the Python checks) leaves the group usable."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    q, k, v, dout = _inputs(11, LOCAL_SEQLEN * world_size, 4, 2, 16)
    ring = _ring(group, q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v, dout, "zigzag", causal=True)
    expected = _shard_of_single(_single(q, k, v, dout, causal=True), "zigzag", rank, world_size)
    errors = [float((a - b).abs().max()) for a, b in zip(ring, expected)]
    assert max(errors) <= 1e-5 * max(float(expected[0].abs().max()), 1.0), f"(out, lse, dq, dk, dv) differ: {errors}"
    shards = [f4d.shard_sequence(t, group) for t in (q, k, v)]
    messages = []
    for _ in range(3):
        try:
            f4d.ring_flash_attn_func(*shards, group, softcap=-1.0, timeout=20)
        except ValueError as error:
            messages.append(str(error))
    out = f4d.ring_flash_attn_func(*shards, group, causal=True, timeout=20)
    assert torch.allclose(out, expected[0], rtol=0, atol=1e-5)
    return messages


def one_rank(group):
    """A group of one rank: the plain call, bit for bit."""
    q, k, v, dout = _inputs(3, 16, 4, 2, 16)
    for layout in ("contiguous", "zigzag"):
        ring = _ring(group, q, k, v, dout, layout, causal=True, window_size=(5, -1))
        single = _single(q, k, v, dout, causal=True, window_size=(5, -1))
        assert all(torch.equal(a, b) for a, b in zip(ring, single))
    return True


def missing_rank(group):
    """The group's rank 1 never calls; its rank 0 must raise within its 3 s timeout, not wait forever."""
    if dist.get_rank(group) == 1:
        time.sleep(5)  # stays in the group (alive) without calling
        return None
    q = torch.randn(1, 8, 2, 16)
    start = time.monotonic()
    try:
        f4d.ring_flash_attn_func(q, q, q, group, timeout=datetime.timedelta(seconds=3))
    except RuntimeError as error:
        return (type(error).__name__, str(error)[:300], time.monotonic() - start)
    return ("no error", "", time.monotonic() - start)


# Each part runs on a group of the spawned world of 4 ranks: (name, ranks of the group, function). Subgroups
# that do not start at rank 0 check that the ring maps group ranks to global ranks. The part that times out
# runs last (a group that timed out may not be used again).
PARTS = [
    ("world-4", [0, 1, 2, 3], check_cases),
    ("world-4-deterministic-bf16", [0, 1, 2, 3], check_deterministic_and_bf16),
    ("world-2", [0, 1], check_cases),
    ("world-3", [1, 2, 3], check_cases),
    ("world-3-deterministic-bf16", [1, 2, 3], check_deterministic_and_bf16),
    ("world-2-deterministic-bf16", [2, 3], check_deterministic_and_bf16),
    ("mismatch", [0, 2, 3], mismatched_calls),
    ("noncontiguous-errors", [0, 3], noncontiguous_and_library_errors),
    ("one-rank", [1], one_rank),
    ("missing-rank", [1, 2], missing_rank),
]
SPAWNED_WORLD = 4


def run_parts(rank, world_size):
    """Every part on this rank: {part: ("ok", value) or ("error", traceback)} for the parts it is in."""
    groups = [dist.new_group(ranks) for _, ranks, _ in PARTS]  # every rank creates every group, in order
    results = {}
    for (name, ranks, fn), group in zip(PARTS, groups):
        if rank not in ranks:
            continue
        try:
            # Parts start together: a part's own timeouts (mismatch: 20 s) then time only its calls.
            dist.barrier(group)
            results[name] = ("ok", fn(group))
        except Exception:  # noqa: BLE001 (reported by the test of this part)
            results[name] = ("error", traceback.format_exc())
    return results


@pytest.fixture(scope="module")
def part_results(tmp_path_factory):
    """{part: {global rank: value}} from one spawned world (starting processes costs more than the parts)."""
    reports = values_or_fail(run_on_ranks(run_parts, SPAWNED_WORLD, tmp_path_factory.mktemp("ring")))
    return {name: {rank: reports[rank][name] for rank in ranks} for name, ranks, _ in PARTS}


def _values(part_results, name):
    failures = [f"rank {r}:\n{v}" for r, (status, v) in sorted(part_results[name].items()) if status != "ok"]
    assert not failures, f"{name}:\n" + "\n".join(failures)
    return {r: v for r, (_, v) in part_results[name].items()}


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_equals_single_process(part_results, world_size):
    worst = _values(part_results, f"world-{world_size}")
    assert len(worst) == world_size and all(len(w) == 5 for w in worst.values())


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_deterministic_and_bf16(part_results, world_size):
    assert all(_values(part_results, f"world-{world_size}-deterministic-bf16").values())


def test_one_rank_group_is_the_plain_call(part_results):
    assert _values(part_results, "one-rank") == {1: True}


def test_mismatched_ranks_raise_on_every_rank(part_results):
    values = _values(part_results, "mismatch")
    expected = ["disagree on q.shape[1] (rank 0: 8, rank 1: 6, rank 2: 8)",
                "disagree on q.dtype (rank 0: torch.float32, rank 1: torch.float32, rank 2: torch.float64)",
                "disagree on causal (rank 0: 1, rank 1: 0, rank 2: 0)",
                "disagree on window_left (rank 0: 4, rank 1: 5, rank 2: 5)",
                "layout 'zigzag' needs a local sequence length divisible by 2, got q.shape[1] = 7",
                "k.shape[-1] (head_dim) = 8 but q.shape[-1] = 16",
                "v has 2 heads but k has 1; they must match"]
    assert len(values) == 3
    for rank, messages in values.items():
        assert len(messages) == len(expected)
        for want, (message, seconds) in zip(expected, messages):
            assert message is not None, f"rank {rank}: no error for '{want}'"
            assert want in message, f"rank {rank}: {message!r} lacks {want!r}"
            assert seconds < 20, f"rank {rank}: the error took {seconds:.1f} s"


def test_noncontiguous_q_and_library_errors_mid_ring(part_results):
    values = _values(part_results, "noncontiguous-errors")
    for rank, messages in values.items():
        assert len(messages) == 3 and all("softcap" in m for m in messages), f"rank {rank}: {messages}"


def test_missing_rank_times_out(part_results):
    values = _values(part_results, "missing-rank")
    name, message, seconds = values[1]  # group rank 0 is global rank 1
    assert name != "no error", "group rank 0 returned although group rank 1 never called"
    assert 2.5 <= seconds < 15, f"group rank 0 raised after {seconds:.1f} s ({name}: {message})"


def test_no_process_group_is_a_clear_error():
    assert not dist.is_initialized()
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized; call torch.distributed."
                                           "init_process_group"):
        f4d.ring_flash_attn_func(q, q, q)


def test_reference_inputs_are_not_trivial():
    """The cases' inputs give attention with visible differences between rows (a test that cannot fail
    otherwise: all-equal rows would make any row permutation pass)."""
    q, k, v, _ = _inputs(100, LOCAL_SEQLEN * 2, 4, 4, 16)
    out = flash4.flash_attn_func(q, k, v, causal=True)
    assert float((out[:, 1:] - out[:, :-1]).abs().max()) > 0.1
    assert np.isfinite(out.numpy()).all()

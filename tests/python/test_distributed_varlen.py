"""flash4.distributed.ring_flash_attn_varlen_func in spawned gloo process groups of 2, 3 and 4 ranks on the CPU:
outputs, LSE and gradients (q, k, v and the learnable sink) equal to the single-process flash_attn_varlen_func on
the unsharded packed batch (documents of 1 to 22 tokens, lengths not divisible by the rank count, causal and
not, windows, softcap, GQA/MQA, both layouts, ranks that hold no token), deterministic runs bit-identical, and
errors: ranks that disagree or whose own shard is wrong raise the same ValueError on every rank, a rank that
never joins makes the other raise within the timeout."""

import time
import traceback

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import flash4  # noqa: E402
import flash4.distributed as f4d  # noqa: E402
from distributed_harness import run_on_ranks, values_or_fail  # noqa: E402

LENGTHS = [13, 1, 6, 22, 3]  # 45 tokens; no length but 22 divisible by 2W for W = 2, 3, 4
TINY = [1, 2]  # 3 tokens: with 3 or 4 ranks some ranks hold no token at all

# (name, lengths, layout, heads, heads_kv, head_dim, causal, window, softcap, sink)
CASES = [
    ("full", LENGTHS, "zigzag", 4, 4, 16, False, (-1, -1), 0.0, False),
    ("full-gqa-contiguous", LENGTHS, "contiguous", 4, 2, 16, False, (-1, -1), 0.0, False),
    ("causal", LENGTHS, "zigzag", 4, 4, 32, True, (-1, -1), 0.0, False),
    ("causal-mqa", LENGTHS, "zigzag", 4, 1, 16, True, (-1, -1), 0.0, False),
    ("causal-contiguous", LENGTHS, "contiguous", 2, 2, 16, True, (-1, -1), 0.0, False),
    ("causal-window-5-gqa", LENGTHS, "zigzag", 4, 2, 16, True, (5, -1), 0.0, False),
    ("window-4-3", LENGTHS, "zigzag", 2, 2, 16, False, (4, 3), 0.0, False),
    ("window-right-only", LENGTHS, "zigzag", 2, 2, 16, False, (-1, 2), 0.0, False),
    ("causal-softcap", LENGTHS, "zigzag", 2, 2, 16, True, (-1, -1), 5.0, False),
    ("causal-sink-gqa", LENGTHS, "zigzag", 4, 2, 16, True, (-1, -1), 0.0, True),
    ("window-sink", LENGTHS, "zigzag", 2, 1, 16, False, (3, 2), 0.0, True),
    ("tiny-causal-sink", TINY, "zigzag", 2, 2, 16, True, (-1, -1), 0.0, True),
]


def _offsets(lengths):
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32)


def _inputs(seed, lengths, heads, heads_kv, head_dim, sink):
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    q = torch.randn(n, heads, head_dim, generator=g)
    k = torch.randn(n, heads_kv, head_dim, generator=g)
    v = torch.randn(n, heads_kv, head_dim, generator=g)
    dout = torch.randn(n, heads, head_dim, generator=g)
    return q, k, v, dout, (torch.randn(heads, generator=g) if sink else None)


def _ring(group, cu, q, k, v, dout, sink, layout, **options):
    """(out, lse, dq, dk, dv[, dsink summed over the ranks]) of the ring on this rank's shards."""
    q, k, v, dout = (f4d.shard_varlen(t, cu, group, layout) for t in (q, k, v, dout))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    sink = None if sink is None else sink.clone().requires_grad_()
    max_seqlen = int((cu[1:] - cu[:-1]).max())
    out, lse = f4d.ring_flash_attn_varlen_func(q, k, v, cu, max_seqlen, group, layout=layout, return_lse=True,
                                               learnable_sink=sink, **options)
    out.backward(dout)
    results = (out.detach(), lse, q.grad, k.grad, v.grad)
    if sink is not None:
        dsink = sink.grad.clone()
        dist.all_reduce(dsink, group=group)  # each rank's share of the replicated parameter's gradient
        results += (dsink,)
    return results


def _single(cu, q, k, v, dout, sink, **options):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    sink = None if sink is None else sink.clone().requires_grad_()
    max_seqlen = int((cu[1:] - cu[:-1]).max())
    out, lse = flash4.flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, return_lse=True,
                                             learnable_sink=sink, **options)
    out.backward(dout)
    return (out.detach(), lse, q.grad, k.grad, v.grad) + ((sink.grad,) if sink is not None else ())


def check_cases(group):
    """Every case of CASES equals the single-process call within fp32 rounding. Failures are collected and
    raised after the last case, so that every rank makes every ring call (no rank stalls its peers)."""
    worst, failures = {}, []
    for n, (name, lengths, layout, heads, heads_kv, head_dim, causal, window, softcap, sink) in enumerate(CASES):
        cu = _offsets(lengths)
        q, k, v, dout, sink = _inputs(200 + n, lengths, heads, heads_kv, head_dim, sink)
        options = dict(causal=causal, window_size=window, softcap=softcap)
        ring = _ring(group, cu, q, k, v, dout, sink, layout, **options)
        single = _single(cu, q, k, v, dout, sink, **options)
        expected = [f4d.shard_varlen(t, cu, group, layout, dim=1 if what == "lse" else 0)
                    for what, t in zip(("out", "lse", "dq", "dk", "dv"), single)] + list(single[5:])
        for what, got, want in zip(("out", "lse", "dq", "dk", "dv", "dsink"), ring, expected):
            if got.shape != want.shape or got.dtype != want.dtype:
                failures.append(f"{name}: {what} is {got.dtype} {tuple(got.shape)}, want {want.dtype} "
                                f"{tuple(want.shape)}")
                continue
            if want.numel() == 0:
                continue
            scale = max(float(want.abs().max()), 1.0)
            error = float((got - want).abs().max())
            worst[what] = max(worst.get(what, 0.0), error / scale)
            # fp32 rounding of another summation order over <= 4 ring blocks (as the dense ring's tests).
            if not error <= 1e-5 * scale:
                failures.append(f"{name}: {what} differs by {error:.3g} (max |ref| {scale:.3g})")
        if n == 0:  # the gathering helper: every rank gets the whole packed tensor
            if not torch.equal(f4d.unshard_varlen(f4d.shard_varlen(single[0], cu, group, layout), cu, group,
                                                  layout), single[0]):
                failures.append("unshard_varlen(shard_varlen(x)) is not x")
            if not torch.allclose(f4d.unshard_varlen(ring[0], cu, group, layout), single[0], rtol=0, atol=1e-5):
                failures.append("unshard_varlen of the ring's output is not the packed output")
    assert not failures, "\n".join(failures)
    return worst


def check_deterministic(group):
    """Two deterministic runs are bit-identical (the merge and accumulation orders are fixed by the ring)."""
    cu = _offsets(LENGTHS)
    q, k, v, dout, sink = _inputs(9, LENGTHS, 4, 2, 16, True)
    options = dict(causal=True, window_size=(6, -1), deterministic=True)
    first = _ring(group, cu, q, k, v, dout, sink, "zigzag", **options)
    second = _ring(group, cu, q, k, v, dout, sink, "zigzag", **options)
    identical = [torch.equal(a, b) for a, b in zip(first, second)]
    assert all(identical), f"deterministic runs differ in (out, lse, dq, dk, dv, dsink): {identical}"
    # Without return_lse the ring returns the output alone, like flash_attn_varlen_func.
    plain = f4d.ring_flash_attn_varlen_func(*(f4d.shard_varlen(t, cu, group) for t in (q, k, v)), cu, 22, group,
                                            learnable_sink=sink, **options)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, first[0])
    return True


def mismatched_calls(group):
    """Calls in which the ranks disagree or a rank's own arguments are wrong; returns (message, seconds) of
    the ValueError each raised."""
    rank = dist.get_rank(group)
    cu = _offsets(LENGTHS)
    q = f4d.shard_varlen(torch.randn(45, 2, 16), cu, group)
    other_cu = _offsets([13, 2, 5, 22, 3])  # the same documents and tokens, another split
    scenarios = [
        ((q[:-1] if rank == 1 else q, q, q, cu), {}),  # rank 1's shard is one token short
        ((q, q, q, other_cu if rank == 2 else cu), {}),  # rank 2 describes another batch
        ((q[..., :8] if rank == 0 else q, q, q, cu), {}),  # another head dim on rank 0
        ((q, q, q, cu), {"causal": rank == 0}),  # another option
        ((q, q, q, cu), {"learnable_sink": torch.zeros(2) if rank == 2 else None}),
        ((q, q, q, torch.tensor([0, 30, 20, 45])), {}),  # invalid offsets, the same on every rank
        # q has 3 heads, k and v 2, on every rank; rank 2 holds no token of this batch, so makes no flash4 call.
        ((torch.zeros(int(rank < 2), 3, 16), q[:int(rank < 2)], q[:int(rank < 2)], [0, 1, 2]), {}),
        ((q, q[..., :8], q, cu), {}),  # k's head dim is not q's, on every rank
        ((q, q, q, cu), {"learnable_sink": torch.zeros(2, dtype=torch.int64)}),  # an integer sink
    ]
    messages = []
    for (q_, k_, v_, cu_), options in scenarios:
        start = time.monotonic()
        try:
            f4d.ring_flash_attn_varlen_func(q_, k_, v_, cu_, None, group, timeout=20, **options)
        except ValueError as error:
            messages.append((str(error), time.monotonic() - start))
        else:
            messages.append((None, time.monotonic() - start))
    return messages


def noncontiguous(group):
    """q, k and v whose last dimension is not contiguous (the plain call copies them) equal the single-process
    call."""
    cu = _offsets(LENGTHS)
    q, k, v, dout, sink = _inputs(5, LENGTHS, 4, 2, 16, True)
    strided = [t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (q, k, v)]
    ring = _ring(group, cu, *strided, dout, sink, "zigzag", causal=True)
    single = _single(cu, q, k, v, dout, sink, causal=True)
    expected = [f4d.shard_varlen(t, cu, group, dim=1 if n == 1 else 0) for n, t in enumerate(single[:5])]
    errors = [float((a - b).abs().max()) for a, b in zip(ring, expected + [single[5]])]
    assert max(errors) <= 1e-5 * max(float(single[0].abs().max()), 1.0), f"(out, lse, dq, dk, dv, dsink): {errors}"
    return True


def one_rank(group):
    """A group of one rank: the plain flash_attn_varlen_func call, bit for bit."""
    cu = _offsets(LENGTHS)
    q, k, v, dout, sink = _inputs(3, LENGTHS, 4, 2, 16, True)
    for layout in ("contiguous", "zigzag"):
        ring = _ring(group, cu, q, k, v, dout, sink, layout, causal=True, window_size=(5, -1))
        single = _single(cu, q, k, v, dout, sink, causal=True, window_size=(5, -1))
        assert all(torch.equal(a, b) for a, b in zip(ring, single))
    return True


def missing_rank(group):
    """The group's rank 1 never calls; its rank 0 must raise within its 2 s timeout, not wait forever."""
    if dist.get_rank(group) == 1:
        time.sleep(3)  # stays in the group (alive) without calling
        return None
    q = torch.randn(4, 2, 16)
    start = time.monotonic()
    try:
        f4d.ring_flash_attn_varlen_func(q, q, q, [0, 3, 8], 5, group, causal=True, timeout=2)
    except RuntimeError as error:
        return (type(error).__name__, str(error)[:300], time.monotonic() - start)
    return ("no error", "", time.monotonic() - start)


# Each part runs on a group of the spawned world of 4 ranks (subgroups not starting at rank 0 check the ring's
# group-to-global rank mapping); the part that times out runs last (a timed-out group is not used again).
PARTS = [
    ("world-4", [0, 1, 2, 3], check_cases),
    ("world-2", [0, 1], check_cases),
    ("world-3", [1, 2, 3], check_cases),
    ("world-3-deterministic", [1, 2, 3], check_deterministic),
    ("mismatch", [0, 2, 3], mismatched_calls),
    ("noncontiguous", [1, 3], noncontiguous),
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
            dist.barrier(group)  # parts start together: a part's own timeouts time only its calls
            results[name] = ("ok", fn(group))
        except Exception:  # noqa: BLE001 (reported by the test of this part)
            results[name] = ("error", traceback.format_exc())
    return results


@pytest.fixture(scope="module")
def part_results(tmp_path_factory):
    """{part: {global rank: value}} from one spawned world (starting processes costs more than the parts)."""
    reports = values_or_fail(run_on_ranks(run_parts, SPAWNED_WORLD, tmp_path_factory.mktemp("ring-varlen")))
    return {name: {rank: reports[rank][name] for rank in ranks} for name, ranks, _ in PARTS}


def _values(part_results, name):
    failures = [f"rank {r}:\n{v}" for r, (status, v) in sorted(part_results[name].items()) if status != "ok"]
    assert not failures, f"{name}:\n" + "\n".join(failures)
    return {r: v for r, (_, v) in part_results[name].items()}


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_varlen_ring_equals_single_process(part_results, world_size):
    worst = _values(part_results, f"world-{world_size}")
    assert len(worst) == world_size and all(len(w) == 6 for w in worst.values())


def test_varlen_ring_deterministic(part_results):
    assert all(_values(part_results, "world-3-deterministic").values())


def test_varlen_one_rank_group_is_the_plain_call(part_results):
    assert _values(part_results, "one-rank") == {1: True}


def test_varlen_mismatched_ranks_raise_on_every_rank(part_results):
    values = _values(part_results, "mismatch")
    expected = [
        "rank 1: q.shape[0] = 14 but this rank's share of cu_seqlens (layout 'zigzag', 3 ranks) is 15 tokens",
        "disagree on cu_seqlens (digest)",
        "disagree on q.shape[2] (rank 0: 8, rank 1: 16, rank 2: 16)",
        "disagree on causal (rank 0: 1, rank 1: 0, rank 2: 0)",
        "disagree on learnable_sink given (rank 0: 0, rank 1: 0, rank 2: 1)",
        "rank 0: cu_seqlens must be non-decreasing, but cu_seqlens[2] = 20 < cu_seqlens[1] = 30; rank 1: ",
        "rank 2: q has 3 heads, k and v 2; GQA/MQA needs heads % heads_kv == 0",
        "rank 0: k.shape[-1] (head_dim) = 8 but q.shape[-1] = 16; q and k must share head_dim",
        "rank 1: learnable_sink has dtype torch.int64 but must be a floating point tensor (heads,)",
    ]
    assert len(values) == 3
    for rank, messages in values.items():
        assert len(messages) == len(expected)
        for want, (message, seconds) in zip(expected, messages):
            assert message is not None, f"rank {rank}: no error for '{want}'"
            assert want in message, f"rank {rank}: {message!r} lacks {want!r}"
            assert seconds < 20, f"rank {rank}: the error took {seconds:.1f} s"


def test_varlen_noncontiguous_inputs(part_results):
    assert all(_values(part_results, "noncontiguous").values())


def test_varlen_missing_rank_times_out(part_results):
    name, message, seconds = _values(part_results, "missing-rank")[1]  # group rank 0 is global rank 1
    assert name != "no error", "group rank 0 returned although group rank 1 never called"
    assert 1.5 <= seconds < 12, f"group rank 0 raised after {seconds:.1f} s ({name}: {message})"

"""The packed ring's computation without process groups, on the CPU and on a Hopper GPU: a ring of W ranks
simulated by W threads of one process (their exchanges through queues) runs the real varlen_ring_forward and
varlen_ring_backward in bf16, so the GPU path of the packed calls (gathered rows, per-window packed calls, LSE
merge, dK/dV accumulation, sink) is tested on the one GPU that NCCL would need W of. Out, LSE and gradients of
q, k, v and the sink pass the tolerance rule against the float64 per-document reference."""

import queue
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

import flash4.distributed as f4d  # noqa: E402
from torch_devices import CUDA  # noqa: E402
from attention_reference import check_tolerance  # noqa: E402
from flash4.distributed._varlen_layout import VarlenLayout  # noqa: E402
from flash4.distributed._varlen_ring import (  # noqa: E402
    varlen_ring_backward,
    varlen_ring_forward,
    varlen_ring_plans,
)
from test_varlen import VarlenCase, numpy64  # noqa: E402


class ThreadRing:
    """A ring of world_size ranks that are threads of this process: the interface of _ring_comm.Ring."""

    def __init__(self, rank, world_size, mailboxes):
        self.rank, self.world_size, self._mailboxes = rank, world_size, mailboxes

    def start_exchange(self, tensors, tag, receive_rows=None):
        self._mailboxes[(self.rank + 1) % self.world_size, tag].put([t.clone() for t in tensors])
        return _Pending(self._mailboxes[self.rank, tag], receive_rows)


class _Pending:
    def __init__(self, mailbox, receive_rows):
        self._mailbox, self._receive_rows = mailbox, receive_rows

    def wait(self):
        received = self._mailbox.get(timeout=120)
        assert all(t.shape[0] == self._receive_rows for t in received), "a shard of another length arrived"
        return received


def run_thread_ring(case, world_size, layout):
    """(out, lse, dq, dk, dv, dsink summed over the ranks) of the unsharded packed batch by a ring of threads."""
    cu = [0]
    for n in case.lens_q:
        cu.append(cu[-1] + n)
    layout_ = VarlenLayout(cu, world_size, layout)
    mailboxes = {(r, tag): queue.Queue() for r in range(world_size) for tag in (0, 1)}
    results, errors = [None] * world_size, []
    left, right = case.window

    def rank_main(rank):
        try:
            ring = ThreadRing(rank, world_size, mailboxes)
            q, k, v, dout = (f4d.shard_varlen_for_rank(t, cu, rank, world_size, layout)
                             for t in (case.q, case.k, case.v, case.dout))
            plans = varlen_ring_plans(ring, layout_, case.causal, left, right, q.device)
            rows = [layout_.rows[(rank - s - 1) % world_size] for s in range(world_size)]
            out, lse = varlen_ring_forward(q, k, v, case.sink, ring, plans, rows, case.scale, case.softcap, False)
            grads = varlen_ring_backward(dout, q, k, v, out, lse, case.sink, ring, plans, rows, case.scale,
                                         case.softcap, False)
            if q.is_cuda:
                torch.cuda.synchronize()
            results[rank] = (out, lse) + grads
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
    gathered = tuple(f4d.unshard_varlen_from_shards([r[n] for r in results], cu, layout, dim=1 if n == 1 else 0)
                     for n in range(5))
    dsink = None if case.sink is None else sum(r[5] for r in results)
    return gathered + (dsink,)


# (world_size, layout, lengths, heads, heads_kv, head_dim, causal, window, softcap, sink)
CASES = [
    (2, "zigzag", [300, 1, 77, 512, 129], 4, 2, 64, True, (-1, -1), 0.0, True),
    (4, "zigzag", [1, 255, 64, 400], 4, 1, 128, True, (100, -1), 0.0, False),
    (3, "contiguous", [190, 7, 260], 2, 2, 64, False, (70, 45), 0.0, False),
    (3, "zigzag", [123, 1, 333], 2, 2, 128, False, (-1, -1), 30.0, True),
]


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"w{c[0]}-{c[1]}-d{c[5]}-c{int(c[6])}-win{c[7][0]}-s{int(c[9])}")
def test_thread_ring_varlen_bf16_within_tolerance(device, case):
    world_size, layout, lengths, heads, heads_kv, head_dim, causal, window, softcap, sink = case
    if device == "cpu" and world_size != 2:
        pytest.skip("the CPU runs one case here (the gloo tests cover the CPU path in fp32)")
    problem = VarlenCase(lengths, lengths, heads, heads_kv, head_dim, torch.bfloat16, device, causal=causal,
                         window=window, softcap=softcap, sink=sink, seed=sum(lengths))
    ring = run_thread_ring(problem, world_size, layout)
    ref_out, ref_lse, ref_grads = problem.run_torch()
    naive_out, naive_lse, naive_grads = problem.run_torch(round_to=torch.bfloat16, stored_out=ring[0])
    extra = 1e-4 if device == "cuda" else 0.0
    check_tolerance("ring out", numpy64(ring[0]), numpy64(ref_out), numpy64(naive_out), "bfloat16")
    check_tolerance("ring lse", numpy64(ring[1]), numpy64(ref_lse), numpy64(naive_lse), "float32", extra)
    for what, got, want, naive in zip(("dq", "dk", "dv", "dsink"), ring[2:], ref_grads, naive_grads):
        check_tolerance(f"ring {what}", numpy64(got), numpy64(want), numpy64(naive), "bfloat16")

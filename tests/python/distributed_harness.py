"""Runs a function on every rank of a spawned gloo process group on the CPU and collects what each rank returns
(or the traceback it raised), with a wall-clock limit: tests of flash4.distributed use it.

The function must be importable by the spawned processes (a module-level function of a test module) and is
called as fn(rank, world_size, *args) after torch.distributed.init_process_group."""

import datetime
import os
import queue
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(fn, rank, world_size, init_file, group_timeout_s, args, results):
    torch.set_num_threads(1)  # several ranks share the machine's cores
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=group_timeout_s))
        value = fn(rank, world_size, *args)
        results.put((rank, "ok", value))
    except BaseException:  # noqa: B036 (reported to the parent, which fails the test)
        results.put((rank, "error", traceback.format_exc()))
    results.close()
    results.join_thread()
    # A rank whose peers gave up may still hold pending ring operations: leave without tearing the group
    # down (destroy_process_group could wait on them).
    os._exit(0)


def run_on_ranks(fn, world_size, tmp_path, args=(), group_timeout_s=60.0, limit_s=240.0):
    """{rank: ("ok", value) or ("error", traceback)} for every rank; raises AssertionError when a rank did
    not report within limit_s seconds (the ranks are then ended)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_file = os.path.join(str(tmp_path), f"init-{world_size}-{time.monotonic_ns()}")
    procs = [ctx.Process(target=_worker, args=(fn, r, world_size, init_file, group_timeout_s, args, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    reports = {}
    deadline = time.monotonic() + limit_s
    try:
        while len(reports) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, status, value = results.get(timeout=min(remaining, 5.0))
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and results.empty():
                    break
                continue
            reports[rank] = (status, value)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    missing = sorted(set(range(world_size)) - set(reports))
    assert not missing, f"ranks {missing} of {world_size} reported nothing within {limit_s} s (hang or crash)"
    return reports


def values_or_fail(reports):
    """The ranks' return values; fails with every failing rank's traceback."""
    errors = [f"rank {r}:\n{v}" for r, (s, v) in sorted(reports.items()) if s != "ok"]
    assert not errors, "\n".join(errors)
    return {r: v for r, (s, v) in reports.items()}

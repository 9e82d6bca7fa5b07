"""Decode (one query token against a KV cache) in ONE process: flash4.flash_attn_with_kvcache (contiguous and
paged caches), flash4.flash_attn_func (its decode route), flash4.flash_attn_varlen_func on a paged cache
(block_table, one query per sequence: a serving engine's decode call; `_mixed`: 1-4 queries per sequence, a
speculative verify step, through the packed-query call; `_prefill`: the same with a 512-query chunk as the first
sequence, in one call and, `_prefill_two_calls`, split by hand into the chunk and the steps), cuDNN SDPA,
and FlashAttention-4's flash_attn_func (`from flash_attn.cute import flash_attn_func`) when importable; the rows
of issue #19 (GQA 32/8, head_dim 128, bf16). Prints one JSON line per (implementation, row): the median kernel time of back-to-back calls
(us), the KV read bandwidth (TB/s), the median single synchronized call (us) and the median CUDA-graph replay of
one captured call (us_graph: kernel time without the host's per-call cost, the way a serving loop that captures its
decode step runs). Cache copies are rotated so that the working set exceeds L2."""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sdpa_bench import median_ms, single_call_ms  # noqa: E402

ROWS = ((1, 8192), (1, 65536), (1, 131072), (8, 8192), (8, 32768), (32, 16384), (64, 4096), (128, 2048))
IMPLS = ("flash4_kvcache", "flash4_kvcache_paged256", "flash4_kvcache_paged16", "flash4_func",
         "flash4_varlen_paged256", "cudnn", "fa4")
# Also on request: flash4_kvcache_paged16_ordered (pages of 16 in table order: the shuffle's cost),
# flash4_varlen_paged256_mixed, flash4_varlen_paged256_prefill and flash4_varlen_paged256_prefill_two_calls.
PREFILL_CHUNK = 512  # the _prefill rows' first sequence: a chunk of this many queries beside the decode steps


def make_impls(names, log):
    """{name: fn(q, k, v, seqlens, table, page) -> out} for the names whose packages import."""
    import torch

    fns = {}
    if any(n.startswith("flash4") for n in names):
        try:
            import flash4

            def kvcache(q, k, v, seqlens, table, page):
                return flash4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, block_table=table)
            for n in ("flash4_kvcache", "flash4_kvcache_paged256", "flash4_kvcache_paged16",
                      "flash4_kvcache_paged16_ordered"):
                fns[n] = kvcache
            fns["flash4_func"] = lambda q, k, v, seqlens, table, page: flash4.flash_attn_func(q, k, v)

            offsets = {}  # cu_seqlens_q per batch, built once as an engine keeps it

            def varlen_paged(q, k, v, seqlens, table, page):  # a serving engine's paged varlen decode call
                batch = q.shape[0]
                if batch not in offsets:
                    offsets[batch] = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
                cu_q = offsets[batch]
                return flash4.flash_attn_varlen_func(q.flatten(0, 1), k, v, cu_q, None, 1, k.shape[1] * table.shape[1],
                                                     seqused_k=seqlens, block_table=table)
            fns["flash4_varlen_paged256"] = varlen_paged

            mixed = {}  # per (batch, chunk): q of the sequences' queries and its offsets, built once

            def mixed_batch(q, chunk):
                """Queries 1, 2, 3, 4, 1, ... a sequence, sequence 0 a prefill chunk of `chunk` queries if > 0."""
                batch = q.shape[0]
                if (batch, chunk) not in mixed:
                    counts = torch.arange(batch, device=q.device) % 4 + 1
                    if chunk:
                        counts[0] = chunk
                    cu_q = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
                    cu_q[1:] = counts.cumsum(0)
                    mixed[batch, chunk] = (torch.randn(int(counts.sum()), q.shape[2], q.shape[3], dtype=q.dtype,
                                                       device=q.device), cu_q, int(counts.max()))
                return mixed[batch, chunk]

            def varlen_mixed(q, k, v, seqlens, table, page, chunk=0):
                qm, cu_q, most = mixed_batch(q, chunk)
                return flash4.flash_attn_varlen_func(qm, k, v, cu_q, None, most, k.shape[1] * table.shape[1],
                                                     seqused_k=seqlens, block_table=table, causal=True)
            fns["flash4_varlen_paged256_mixed"] = varlen_mixed
            fns["flash4_varlen_paged256_prefill"] = lambda *a: varlen_mixed(*a, chunk=PREFILL_CHUNK)

            def prefill_in_two_calls(q, k, v, seqlens, table, page):
                # The same batch as two flash_attn_with_kvcache calls, the chunk alone and the decode steps packed:
                # what a caller who splits the batch by hand runs (one launch each, no index ops).
                qm, cu_q, _ = mixed_batch(q, PREFILL_CHUNK)
                chunk = flash4.flash_attn_with_kvcache(qm[None, :PREFILL_CHUNK], k, v, cache_seqlens=seqlens[:1],
                                                       block_table=table[:1], causal=True)
                steps = flash4.flash_attn_with_kvcache(qm[PREFILL_CHUNK:], k, v, cache_seqlens=seqlens[1:],
                                                       block_table=table[1:], causal=True,
                                                       cu_seqlens_q=cu_q[1:] - PREFILL_CHUNK, max_seqlen_q=4)
                return chunk, steps
            fns["flash4_varlen_paged256_prefill_two_calls"] = prefill_in_two_calls
        except Exception as e:
            log(f"flash4 left out: {type(e).__name__}: {e}")
    if "cudnn" in names:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def cudnn(q, k, v, seqlens, table, page):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      enable_gqa=True).transpose(1, 2)
        fns["cudnn"] = cudnn
    if "fa4" in names:
        try:
            from flash_attn.cute import flash_attn_func as fa4_func

            def fa4(q, k, v, seqlens, table, page):
                out = fa4_func(q, k, v)
                return out[0] if isinstance(out, tuple) else out
            fns["fa4"] = fa4
        except Exception as e:
            log(f"fa4 left out: flash_attn.cute does not import ({type(e).__name__}: {e})")
    return {n: fns[n] for n in names if n in fns}


def page_of(name):
    return 256 if "paged256" in name else 16 if "paged16" in name else 0


def inputs(batch, seqlen, page, sets, device="cuda", ordered=False):
    """`sets` copies of (q, k_cache, v_cache, cache_seqlens, block_table); paged pools hold shuffled pages (in
    table order if `ordered`)."""
    import torch
    out = []
    for _ in range(sets):
        q = torch.randn(batch, 1, 32, 128, dtype=torch.bfloat16, device=device)
        if page:
            pages = batch * seqlen // page
            k = torch.randn(pages, page, 8, 128, dtype=torch.bfloat16, device=device)
            v = torch.randn_like(k)
            order = torch.arange if ordered else torch.randperm
            table = order(pages, device=device, dtype=torch.int32).reshape(batch, seqlen // page)
        else:
            k = torch.randn(batch, seqlen, 8, 128, dtype=torch.bfloat16, device=device)
            v = torch.randn_like(k)
            table = None
        seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device=device)
        out.append((q, k, v, seqlens, table))
    return out


def graph_ms(fn, iters, sets, warm_ms):
    """Median replay time of one CUDA graph per set, each holding one captured call."""
    import torch
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graphs = []
    with torch.cuda.stream(stream):
        for i in range(sets):
            fn(i)  # outside capture first: lazy initialization (cuDNN plans, workspaces) must not be captured
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                fn(i)
            graphs.append(g)
    torch.cuda.synchronize()
    return median_ms(lambda i: graphs[i].replay(), iters, sets, warm_ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split(";")[0])
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warm-ms", type=float, default=100.0)
    ap.add_argument("--rows", default="", help="only these rows, e.g. 8x32768,1x65536 (for profilers)")
    args = ap.parse_args()
    rows = [tuple(map(int, r.split("x"))) for r in args.rows.split(",") if r] or ROWS
    import torch
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    fns = make_impls([n.strip() for n in args.impls.split(",") if n.strip()], log)
    for batch, seqlen in rows:
        kv_bytes = 2 * batch * seqlen * 8 * 128 * 2
        sets = max(1, (200 << 20) // kv_bytes + 1)
        for name, fn in fns.items():
            page = page_of(name)
            data = inputs(batch, seqlen, page, sets, ordered=name.endswith("_ordered"))
            run = lambda i: fn(*data[i], page)  # noqa: E731
            try:
                ms = median_ms(run, args.iters, sets, args.warm_ms)
                single = single_call_ms(run, 20, sets)
            except Exception as e:  # one implementation's refusal must not end the sweep
                log(f"{name} {batch}x{seqlen}: {type(e).__name__}: {e}")
                continue
            try:
                graph = round(graph_ms(run, args.iters, sets, args.warm_ms) * 1e3, 2)
            except Exception as e:  # not every implementation can be captured
                log(f"{name} {batch}x{seqlen}: no graph replay: {type(e).__name__}: {e}")
                graph = None
            print(json.dumps({"bench": "decode", "impl": name, "b": batch, "s": seqlen, "h": 32, "hkv": 8, "d": 128,
                              "us": round(ms * 1e3, 2), "tbps": round(kv_bytes / (ms * 1e-3) / 1e12, 3),
                              "us_single": round(single * 1e3, 2), "us_graph": graph}), flush=True)
            del data
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Train the same small causal transformer with flash4 attention and with PyTorch SDPA; compare loss curves and
tokens/s. Meant for a CUDA GPU (bf16 autocast); runs on the CPU with --small for a smoke test.

    python tests/python/train_compare.py --out $OUT            # 200 steps, 4 layers, d 512, 8 heads, seq 1024
    python tests/python/train_compare.py --small --device cpu  # seconds, for checking the script itself

Data: synthetic token sequences with structure a model can learn and that needs attention: the first half of
each sequence is a random walk on a sparse Markov chain (each token has a few likely successors), the second half
repeats the first (an induction / copy task). Batches depend only on the seed and the step, so both runs see the
same data; both models start from the same initial weights.

Writes train_compare.json (config, per-step losses, tokens/s, errors) and train_compare.png (loss curves) into
--out, and prints a table last.
"""

import argparse
import json
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from torch import nn


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seqlen", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=20, help="learning-rate warm-up steps")
    p.add_argument("--timing-skip", type=int, default=20, help="steps left out of tokens/s (warm-up, allocator)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--attention", default="flash4,sdpa", help="comma-separated runs: flash4, sdpa")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON and the PNG")
    p.add_argument("--small", action="store_true", help="tiny model and few steps (smoke test)")
    args = p.parse_args(argv)
    if args.small:
        args.steps, args.layers, args.dim, args.heads, args.seqlen, args.batch = 12, 2, 64, 2, 64, 2
        args.warmup, args.timing_skip = 2, 2
    return args


# ---- data ------------------------------------------------------------------------------------------------


class CopyMarkovData:
    """Batches of (batch, seqlen) tokens: a sparse Markov chain walk, then the same walk again."""

    def __init__(self, vocab, seqlen, batch, seed, device, successors=4):
        gen = torch.Generator().manual_seed(seed)
        self.next_tokens = torch.randint(0, vocab, (vocab, successors), generator=gen)
        self.vocab, self.seqlen, self.batch, self.seed, self.device = vocab, seqlen, batch, seed, device
        self.successors = successors

    def batch_for(self, step):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step + 1)
        half = (self.seqlen + 1) // 2
        tokens = torch.empty(self.batch, half, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab, (self.batch,), generator=gen)
        choice = torch.randint(0, self.successors, (self.batch, half), generator=gen)
        for t in range(1, half):
            tokens[:, t] = self.next_tokens[tokens[:, t - 1], choice[:, t]]
        seq = torch.cat([tokens, tokens], dim=1)[:, : self.seqlen + 1]
        seq = seq.to(self.device, non_blocking=True)
        return seq[:, :-1], seq[:, 1:]


# ---- model -----------------------------------------------------------------------------------------------


def flash4_attention(q, k, v):
    import flash4

    return flash4.flash_attn_func(q, k, v, causal=True)


def sdpa_attention(q, k, v):
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


ATTENTION = {"flash4": flash4_attention, "sdpa": sdpa_attention}


class Block(nn.Module):
    def __init__(self, dim, heads, attention):
        super().__init__()
        self.heads, self.head_dim, self.attention = heads, dim // heads, attention
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        batch, seqlen, dim = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, seqlen, 3, self.heads, self.head_dim)
        q, k, v = qkv.unbind(dim=2)  # (batch, seqlen, heads, head_dim) views, flash4's layout
        x = x + self.proj(self.attention(q, k, v).reshape(batch, seqlen, dim))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seqlen, attention):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seqlen, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, attention) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# ---- training --------------------------------------------------------------------------------------------


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(args, name):
    device = torch.device(args.device)
    torch.manual_seed(args.seed)  # same initial weights for every run
    model = TinyGPT(args.vocab, args.dim, args.heads, args.layers, args.seqlen, ATTENTION[name]).to(device)
    data = CopyMarkovData(args.vocab, args.seqlen, args.batch, args.seed, device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95),
                            fused=device.type == "cuda")
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    batches = [data.batch_for(step) for step in range(args.steps)]  # generated before timing starts

    losses, step_seconds = [], []
    for step in range(args.steps):
        inputs, targets = batches[step]
        synchronize(device)
        start = time.perf_counter()
        with autocast:
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        synchronize(device)
        step_seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"loss is {losses[-1]} at step {step}")
        if step % 50 == 0 or step == args.steps - 1:
            print(f"  [{name}] step {step:4d}  loss {losses[-1]:.4f}  {step_seconds[-1] * 1e3:.1f} ms", flush=True)

    timed = step_seconds[args.timing_skip :] or step_seconds
    tokens_per_step = args.batch * args.seqlen
    return {
        "losses": losses,
        "step_ms_median": 1e3 * sorted(timed)[len(timed) // 2],
        "tokens_per_s": tokens_per_step * len(timed) / sum(timed),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }


def plot(results, path, title):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, height_ratios=[3, 1])
    ok = {n: r for n, r in results.items() if r.get("losses")}
    for name, r in ok.items():
        top.plot(r["losses"], label=f"{name} ({r['tokens_per_s'] / 1e3:.0f}k tok/s)", linewidth=1.2)
    top.set_ylabel("training loss")
    top.set_title(title)
    top.legend()
    top.grid(alpha=0.3)
    if "flash4" in ok and "sdpa" in ok:
        diff = [a - b for a, b in zip(ok["flash4"]["losses"], ok["sdpa"]["losses"])]
        bottom.plot(diff, color="black", linewidth=1)
        bottom.axhline(0, color="gray", linewidth=0.5)
    bottom.set_ylabel("flash4 - sdpa")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    config = {k: v for k, v in vars(args).items() if k != "out"}
    config.update(gpu=gpu, torch=torch.__version__)
    try:
        import flash4

        config["flash4"] = flash4.__version__
        config["flash4_cuda_available"] = flash4.cuda_available()
    except ImportError as error:
        config["flash4"] = f"not importable: {error}"
    print(f"train_compare: {config}", flush=True)

    results = {}
    for name in args.attention.split(","):
        print(f"run {name}", flush=True)
        try:
            results[name] = train(args, name)
        except Exception as error:  # report and go on with the other runs
            traceback.print_exc()
            results[name] = {"error": f"{type(error).__name__}: {error}"}
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

    summary = {}
    if all("losses" in results.get(n, {}) for n in ("flash4", "sdpa")):
        a, b = results["flash4"]["losses"], results["sdpa"]["losses"]
        diffs = [abs(x - y) for x, y in zip(a, b)]
        tail = max(1, len(a) // 4)
        summary = {
            "max_abs_loss_diff": max(diffs),
            "mean_abs_loss_diff_last_quarter": sum(diffs[-tail:]) / tail,
            "final_loss_flash4": a[-1],
            "final_loss_sdpa": b[-1],
            "speedup_tokens_per_s": results["flash4"]["tokens_per_s"] / results["sdpa"]["tokens_per_s"],
        }
    report = {"config": config, "results": results, "summary": summary}
    with open(os.path.join(args.out, "train_compare.json"), "w") as f:
        json.dump(report, f, indent=1)
    title = (f"{args.layers} layers, d {args.dim}, {args.heads} heads, seq {args.seqlen}, batch {args.batch}, "
             f"{'bf16 autocast' if device.type == 'cuda' else 'fp32'}, {gpu}")
    png = plot(results, os.path.join(args.out, "train_compare.png"), title)

    print(f"\nwrote {os.path.join(args.out, 'train_compare.json')}" + (f" and {png}" if png else ""))
    print(f"\n{'attention':<10} {'status':<8} {'final loss':>10} {'tokens/s':>12} {'step ms':>9}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<10} {'FAILED':<8} {r['error'][:100]}")
        else:
            print(f"{name:<10} {'ok':<8} {r['losses'][-1]:>10.4f} {r['tokens_per_s']:>12,.0f} "
                  f"{r['step_ms_median']:>9.2f}")
    if summary:
        print(f"loss |flash4 - sdpa|: max {summary['max_abs_loss_diff']:.4f}, mean over the last quarter "
              f"{summary['mean_abs_loss_diff_last_quarter']:.4f}; flash4/sdpa tokens/s "
              f"{summary['speedup_tokens_per_s']:.3f}x")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

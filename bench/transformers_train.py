"""A Hugging Face transformers Llama-architecture model (built from a config, randomly initialised, bf16) trained
on the GPU with attn_implementation = flash4 ("f4", flash4.integrations.transformers) and = "sdpa", in ONE
process, steps alternating between the two: forward + backward + AdamW step per iteration, median step time and
tokens/s. Two batches: a dense one (batch x seqlen) and the same tokens packed padding-free (documents of lengths
drawn from 128..4096 concatenated, position_ids restarting per document: flash4's varlen path; SDPA gets the
dense batch of the same shape there, since transformers' SDPA path has no padding-free packing). Prints one JSON
line per (implementation, batch)."""

import argparse
import json
import random
import statistics

import torch
import transformers

import flash4.integrations.transformers as f4hf


def make_model(implementation, args):
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                                      num_hidden_layers=args.layers, num_attention_heads=args.hidden // args.head_dim,
                                      num_key_value_heads=args.hidden // args.head_dim // args.gqa,
                                      head_dim=args.head_dim, max_position_embeddings=args.tokens,
                                      attention_dropout=0.0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.set_attn_implementation(implementation)
    model = model.to(device="cuda", dtype=torch.bfloat16).train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def document_lengths(tokens, rng):
    lengths = []
    while sum(lengths) < tokens:
        lengths.append(min(rng.randint(128, 4096), tokens - sum(lengths)))
    return lengths


def steps_ms(model, optimizer, ids, position_ids, steps=1):
    """Milliseconds per training step (forward + backward + AdamW), over `steps` steps."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        loss = model(ids, position_ids=position_ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def profile_step(model, optimizer, ids, position_ids, steps=3, top=12):
    """Kernel time per step by kernel name (torch.profiler), the GPU's busy time and the wall time of `steps`
    steps: where a gap between two implementations comes from."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall_ms = steps_ms(model, optimizer, ids, position_ids, steps)
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] = kernels.get(e.name, 0.0) + e.device_time / 1e3 / steps
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1])
    return {"wall_ms": round(wall_ms, 3), "gpu_busy_ms": round(sum(kernels.values()), 3),
            "top_kernels": [[name[:90], round(ms, 3)] for name, ms in ranked[:top]]}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--gqa", type=int, default=4, help="query heads per kv head")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per sequence of the dense batch")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="also profile a few steps per implementation")
    args = parser.parse_args()
    models = {name: make_model(impl, args) for name, impl in (("flash4", f4hf.register()), ("sdpa", "sdpa"))}
    rng = random.Random(0)
    ids = torch.randint(0, 32000, (args.batch, args.tokens), device="cuda")
    dense_pos = torch.arange(args.tokens, device="cuda").expand(args.batch, -1)
    lengths = document_lengths(args.batch * args.tokens, rng)
    packed_pos = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    batches = {
        "dense": {"flash4": (ids, dense_pos), "sdpa": (ids, dense_pos)},
        "packed": {"flash4": (ids.reshape(1, -1), packed_pos), "sdpa": (ids, dense_pos)},
    }
    for batch_name, inputs in batches.items():
        times = {name: [] for name in models}
        for i in range(args.steps + 3):  # 3 warm-up steps, then alternate the order every step
            order = list(models) if i % 2 == 0 else list(models)[::-1]
            for name in order:
                t = steps_ms(*models[name], *inputs[name])
                if i >= 3:
                    times[name].append(t)
        for name, ts in times.items():
            ms = statistics.median(ts)
            print(json.dumps({"bench": "transformers_train", "impl": name, "batch": batch_name,
                              "tokens": args.batch * args.tokens, "documents": len(lengths) if batch_name == "packed"
                              and name == "flash4" else args.batch, "hidden": args.hidden, "head_dim": args.head_dim,
                              "layers": args.layers, "ms": round(ms, 3),
                              "tokens_per_s": round(args.batch * args.tokens / ms * 1e3)}), flush=True)
        if args.profile:
            for name in models:
                print(json.dumps({"bench": "transformers_train_profile", "impl": name, "batch": batch_name,
                                  **profile_step(*models[name], *inputs[name])}), flush=True)


if __name__ == "__main__":
    main()

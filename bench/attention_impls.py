"""The attention implementations the Python benchmark times, behind one calling convention.

Every implementation is a function fwd(q, k, v, causal) -> out on (batch, seqlen, heads, head_dim) tensors, with
autograd for the backward:
  flash4, flash4_deterministic   the flash4 package (python/flash4)
  flash4_vpad                    flash4 with v zero-padded to q's head dim: the kernel a split head dim
                                 (sdpa_bench.py --dv) runs on without a kernel of its own
  fa4                            FlashAttention-4's CuTe-DSL kernels (the `flash_attn.cute` module of the
                                 flash-attn-4 package; on the H200 its SM90 forward and backward)
  fa4_nopack                     the same with pack_gqa=False (FA4 packs a GQA group's query heads into the
                                 rows of one tile by default): what the packing is worth in its kernel
  cudnn, fa2                     PyTorch SDPA's cuDNN and flash (FlashAttention-2) backends

This module imports nothing heavy at import time (names and argument checks work without torch or a GPU);
load_impls imports what the requested implementations need and reports the versions it found.
"""

IMPL_NAMES = ("flash4", "flash4_deterministic", "flash4_vpad", "fa4", "fa4_nopack", "cudnn", "fa2")

# Implementations that are optional packages: left out (with a note) when not importable, the rest still run.
OPTIONAL = {"flash4": "flash4", "flash4_deterministic": "flash4", "flash4_vpad": "flash4",
            "fa4": "flash_attn.cute (flash-attn-4)", "fa4_nopack": "flash_attn.cute (flash-attn-4)"}


def parse_impls(text):
    """--impls value -> list of names, in the given order, without repeats; a clear error on anything else."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in IMPL_NAMES]
    if unknown or not names:
        raise ValueError(f"--impls: expected a comma-separated subset of {','.join(IMPL_NAMES)}, got {text!r}"
                         + (f" (unknown: {','.join(unknown)})" if unknown else ""))
    return list(dict.fromkeys(names))


def _package_version(dist_names, module=None):
    """Installed distribution version (first of dist_names found), else module.__version__, else None."""
    from importlib import metadata
    for dist in dist_names:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return getattr(module, "__version__", None)


def _sdpa_fwd(backend_name):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}[backend_name]

    def fwd(q, k, v, causal):
        # SDPA wants (b, h, s, d); the transposes are views.
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal,
                                                  enable_gqa=q.shape[2] != k.shape[2]).transpose(1, 2)
    return fwd


def load_impls(names, log):
    """Returns ({name: fwd}, versions) for the names whose packages import; log(message) says what was left out
    and why. versions: the library versions the timings depend on (torch, cudnn, flash4, flash_attn_4, ...)."""
    import torch
    versions = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    fns = {}
    want_flash4 = any(n.startswith("flash4") for n in names)
    if want_flash4:
        try:
            import flash4
            versions["flash4"] = getattr(flash4, "__version__", None)
            fns["flash4"] = lambda q, k, v, causal: flash4.flash_attn_func(q, k, v, causal=causal)
            fns["flash4_deterministic"] = lambda q, k, v, causal: flash4.flash_attn_func(q, k, v, causal=causal,
                                                                                         deterministic=True)
            padded_v = {}  # v zero-padded to q's head dim, made once per input tensor (outside the timing)

            def flash4_vpad(q, k, v, causal):
                # A v narrower than q run at q's width (the kernel a split head dim has without its own), the
                # output's padded columns dropped: the baseline of the split kernels.
                width = q.shape[-1] - v.shape[-1]
                if v.requires_grad:  # backward timings: the pad in the graph (its copies are < 1 % of the call)
                    padded = torch.nn.functional.pad(v, (0, width))
                    return flash4.flash_attn_func(q, k, padded, causal=causal)[..., :v.shape[-1]]
                key = (v.data_ptr(), v.shape)
                if key not in padded_v:
                    padded_v[key] = torch.nn.functional.pad(v.detach(), (0, width))
                return flash4.flash_attn_func(q, k, padded_v[key], causal=causal)[..., :v.shape[-1]]
            fns["flash4_vpad"] = flash4_vpad
        except Exception as e:  # optional: the SDPA backends are still worth timing
            log(f"flash4 left out: the flash4 package does not import ({type(e).__name__}: {e})")
    if "fa4" in names or "fa4_nopack" in names:
        try:
            import flash_attn.cute as fa4_cute
            fa4_func = fa4_cute.flash_attn_func
            versions["flash_attn_4"] = _package_version(("flash-attn-4", "fa4", "flash_attn_4"), fa4_cute)
            versions["nvidia_cutlass_dsl"] = _package_version(("nvidia-cutlass-dsl",))

            def fa4_fwd(q, k, v, causal):
                # Some releases return (out, lse); the output is the first.
                out = fa4_func(q, k, v, causal=causal)
                return out[0] if isinstance(out, tuple) else out
            fns["fa4"] = fa4_fwd

            def fa4_nopack_fwd(q, k, v, causal):
                out = fa4_func(q, k, v, causal=causal, pack_gqa=False)
                return out[0] if isinstance(out, tuple) else out
            fns["fa4_nopack"] = fa4_nopack_fwd
        except Exception as e:
            log(f"fa4 left out: flash_attn.cute does not import ({type(e).__name__}: {str(e)[:200]}); "
                "see docs/performance.md 'FlashAttention-4 as a peer' for installing it on the device")
    for name in ("cudnn", "fa2"):
        if name in names:
            fns[name] = _sdpa_fwd(name)
    return {n: fns[n] for n in names if n in fns}, versions

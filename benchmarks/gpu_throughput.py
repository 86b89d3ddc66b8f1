"""Training throughput on one GPU: blockforge against transformers' LlamaForCausalLM and timm's ViT.

One call does everything, in one process:
  1. numerics: a blockforge llama in bf16 autocast against the same weights in float32 (blockforge and
     LlamaForCausalLM), and float32 blockforge against float32 LlamaForCausalLM;
  2. the peak bf16 matmul rate of this GPU, measured with a large matmul (the denominator of MFU);
  3. training steps (forward, backward, fused AdamW step; bf16 autocast, float32 weights) of the
     paper's 130M and 1B llama (Pre-LN and Mix-LN 0.25, eager and per-block compiled) against
     LlamaForCausalLM (sdpa) on the same batch, and ViT-Small against timm: tokens/s (images/s), MFU,
     peak memory, as a table with ratios.

    python benchmarks/gpu_throughput.py                      # on a CUDA GPU
    python benchmarks/gpu_throughput.py --tiny --device cpu  # the same code paths on tiny configs
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch
import torch.nn.functional as F

import blockforge
from blockforge import from_timm_vit, to_hf_llama
from blockforge.spec import ModelSpec, resolve
from blockforge.spec.model import LayerRules, LayerSettings, MixLN
from blockforge.train.speed import compile_blocks

SIZES = {  # width, depth, heads, ffn, micro-batch (sequences of 256 tokens)
    "130m": (768, 12, 12, 2048, 64),
    "1b": (2048, 24, 32, 5461, 16),
}
TINY = {"130m": (64, 4, 4, 172, 4), "1b": (128, 4, 4, 344, 2)}
VIT_SMALL = dict(width=384, depth=12, heads=6, ffn=1536, image_size=224, patch_size=16, batch=256)
VIT_TINY = dict(width=64, depth=2, heads=2, ffn=128, image_size=32, patch_size=8, batch=4)


def llama_spec(width, depth, heads, ffn, *, mix: bool, vocab: int, context: int = 256) -> ModelSpec:
    layers = LayerRules(mix_ln=MixLN(alpha=0.25)) if mix else LayerRules(default=LayerSettings(placement="pre"))
    return ModelSpec(family="llama", width=width, depth=depth, heads=heads, ffn=ffn, vocab=vocab, context=context, layers=layers)


def peak_bf16_flops(device: str) -> float:
    n = 8192 if device == "cuda" else 512
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    reps = 50 if device == "cuda" else 3
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - start)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def llama_flops_per_token(spec, params: int, embedding: int) -> float:
    """6 x non-embedding parameters (the head included) + causal attention's 6 x L x T x width."""
    return 6 * (params - embedding) + 6 * spec.depth * spec.context * spec.width


def check_numerics(device: str, tiny: bool) -> dict:
    """bf16 autocast vs float32, and float32 blockforge vs float32 LlamaForCausalLM, on random weights and tokens."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    width, depth, heads, ffn, _ = (TINY if tiny else SIZES)["130m"]
    torch.manual_seed(0)
    model = blockforge.build_model(llama_spec(width, depth, heads, ffn, mix=False, vocab=32000)).to(device)
    hf = to_hf_llama(model).to(device)
    hf.config._attn_implementation = "sdpa"
    tokens = torch.randint(0, 32000, (4, 257), device=device)
    with torch.no_grad():
        ref = model(tokens[:, :-1]).float()
        theirs = hf(tokens[:, :-1]).logits.float()
        with torch.autocast(device, dtype=torch.bfloat16):
            low = model(tokens[:, :-1]).float()
    loss = lambda logits: float(F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()))  # noqa: E731
    result = {
        "fp32_vs_hf_max_abs_logit": float((ref - theirs).abs().max()),
        "bf16_vs_fp32_max_abs_logit": float((low - ref).abs().max()),
        "bf16_vs_fp32_loss_diff": abs(loss(low) - loss(ref)),
        "bf16_vs_fp32_cosine": float(F.cosine_similarity(low.flatten().double(), ref.flatten().double(), dim=0)),
    }
    result["ok"] = result["fp32_vs_hf_max_abs_logit"] < 1e-3 and result["bf16_vs_fp32_loss_diff"] < 0.02 and result["bf16_vs_fp32_cosine"] > 0.999
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return result


HEADER = f"\n{'model':40s} {'batch':>5s} {'tok|img/s':>12s} {'MFU':>7s} {'peak GiB':>9s}"


def report(row: dict) -> dict:
    """Print one table row as soon as it is measured (a run stopped by a time limit keeps what it measured)."""
    print(f"{row['model']:40s} {row['batch']:5d} {row['tok_or_img_per_s']:12,.0f} {row['mfu']:7.1%} {row['peak_mem_gib']:9.2f}", flush=True)
    return row


def time_training(model, make_batch, loss_fn, device: str, steps: int, warmup: int) -> tuple[float, float]:
    """Seconds per step (fwd + bwd + fused AdamW) and peak memory in bytes."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    batch = make_batch()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + steps):
        if i == warmup:
            sync(device)
            start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = loss_fn(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync(device)
    seconds = (time.perf_counter() - start) / steps
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else float("nan")
    del optimizer
    return seconds, peak


def llama_rows(size: str, args, peak: float) -> list[dict]:
    width, depth, heads, ffn, micro = (TINY if args.tiny else SIZES)[size]
    micro = args.micro_batch or micro
    rows = []
    variants = [("blockforge pre", False, False), ("blockforge mix", True, False), ("hf LlamaForCausalLM", False, None),
                ("blockforge pre compiled", False, True), ("blockforge mix compiled", True, True)]
    if args.no_compile:
        variants = [v for v in variants if not v[2]]
    for name, mix, compiled in variants:
        torch.manual_seed(0)
        spec = llama_spec(width, depth, heads, ffn, mix=mix, vocab=32000)
        ours = blockforge.build_model(spec)
        if compiled is None:
            model = to_hf_llama(ours).to(args.device).train()
            model.config._attn_implementation = "sdpa"
            forward = lambda m, x: m(x).logits  # noqa: E731
        else:
            model = ours.to(args.device).train()
            if compiled:
                compile_blocks(model)
            forward = lambda m, x: m(x)  # noqa: E731
        params = sum(p.numel() for p in ours.parameters())
        embedding = ours.embed.weight.numel()
        del ours

        def make_batch():
            return torch.randint(0, 32000, (micro, 257), device=args.device)

        def loss_fn(m, tokens):
            return F.cross_entropy(forward(m, tokens[:, :-1]).float().flatten(0, 1), tokens[:, 1:].flatten())

        seconds, memory = time_training(model, make_batch, loss_fn, args.device, args.steps, args.warmup)
        tokens = micro * 256 / seconds
        flops = llama_flops_per_token(resolve(spec), params, embedding) * tokens
        rows.append(report({"model": f"llama-{size} {name}", "batch": micro, "tok_or_img_per_s": tokens, "mfu": flops / peak, "peak_mem_gib": memory / 2**30}))
        del model
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return rows


def vit_rows(args, peak: float) -> list[dict]:
    from timm.models.vision_transformer import VisionTransformer

    cfg = VIT_TINY if args.tiny else VIT_SMALL
    rows = []
    for name in ("blockforge pre", "blockforge mix", "timm VisionTransformer"):
        torch.manual_seed(0)
        reference = VisionTransformer(img_size=cfg["image_size"], patch_size=cfg["patch_size"], num_classes=1000, embed_dim=cfg["width"],
                                      depth=cfg["depth"], num_heads=cfg["heads"], mlp_ratio=cfg["ffn"] / cfg["width"])
        if name.startswith("timm"):
            model = reference
        elif name.endswith("mix"):
            model = blockforge.build_model(ModelSpec(family="vit", width=cfg["width"], depth=cfg["depth"], heads=cfg["heads"], ffn=cfg["ffn"],
                                                     image_size=cfg["image_size"], patch_size=cfg["patch_size"], classes=1000,
                                                     layers=LayerRules(mix_ln=MixLN(alpha=0.25))))
        else:
            model = from_timm_vit(reference)
        model = model.to(args.device).train()
        params = sum(p.numel() for p in model.parameters())
        batch_size = args.micro_batch or cfg["batch"]
        tokens = (cfg["image_size"] // cfg["patch_size"]) ** 2 + 1

        def make_batch():
            return (torch.randn(batch_size, 3, cfg["image_size"], cfg["image_size"], device=args.device),
                    torch.randint(0, 1000, (batch_size,), device=args.device))

        def loss_fn(m, batch):
            return F.cross_entropy(m(batch[0]).float(), batch[1])

        seconds, memory = time_training(model, make_batch, loss_fn, args.device, args.steps, args.warmup)
        images = batch_size / seconds
        flops = (6 * params * tokens + 12 * cfg["depth"] * tokens * tokens * cfg["width"]) * images
        rows.append(report({"model": f"vit-small {name}", "batch": batch_size, "tok_or_img_per_s": images, "mfu": flops / peak, "peak_mem_gib": memory / 2**30}))
        del model, reference
        gc.collect()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny configs (to check the script on a CPU)")
    parser.add_argument("--sizes", nargs="+", default=["130m", "1b"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--micro-batch", type=int)
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled variants")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")

    numerics = check_numerics(args.device, args.tiny)
    print("numerics:", json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in numerics.items()}))
    peak = peak_bf16_flops(args.device)
    print(f"peak bf16 matmul: {peak / 1e12:.1f} TFLOP/s")
    print(HEADER)
    rows = []
    for size in args.sizes:
        rows += llama_rows(size, args, peak)
    rows += vit_rows(args, peak)

    print(HEADER)
    for r in rows:
        report(r)
    by_name = {r["model"]: r for r in rows}
    print()
    for size in args.sizes:
        hf = by_name[f"llama-{size} hf LlamaForCausalLM"]
        for variant in ("pre", "mix", "pre compiled", "mix compiled"):
            ours = by_name.get(f"llama-{size} blockforge {variant}")
            if ours is None:
                continue
            print(f"llama-{size} blockforge {variant} / HF: {ours['tok_or_img_per_s'] / hf['tok_or_img_per_s']:.3f}x tokens/s, "
                  f"{ours['peak_mem_gib'] / hf['peak_mem_gib'] if hf['peak_mem_gib'] == hf['peak_mem_gib'] else float('nan'):.3f}x memory")
    timm = by_name["vit-small timm VisionTransformer"]
    print(f"vit-small blockforge pre / timm: {by_name['vit-small blockforge pre']['tok_or_img_per_s'] / timm['tok_or_img_per_s']:.3f}x images/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"numerics": numerics, "peak_flops": peak, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()

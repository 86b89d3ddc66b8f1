"""Forward+backward step time and peak memory: blockforge against the reference implementations.

blockforge llama (uniform Pre-LN, and Mix-LN alpha 0.25) against transformers' LlamaForCausalLM (sdpa)
with the same weights, and blockforge vit against timm's VisionTransformer, timed interleaved in one
process so machine noise hits every model alike; peak memory is measured per model in a fresh
subprocess. Prints ratios (blockforge / reference; Mix-LN / Pre-LN).

    python benchmarks/step_time.py                 # CPU-sized configs
    python benchmarks/step_time.py --compile       # compiled: blockforge per block (as train.compile does), references whole
    python benchmarks/step_time.py --device cuda   # on a GPU (peak memory from the CUDA allocator)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import blockforge
from blockforge import from_timm_vit, to_hf_llama
from blockforge.spec import ModelSpec
from blockforge.spec.model import LayerRules, LayerSettings, MixLN

LLAMA = dict(family="llama", width=256, depth=8, heads=8, ffn=688, vocab=8192, context=256)
VIT = dict(family="vit", width=192, depth=6, heads=3, ffn=768, image_size=64, patch_size=8, channels=3, classes=100)


def build(name: str, device: str, dtype: torch.dtype, same_weights: bool = True):
    """(model, make_batch, loss_fn) for one of: bf-llama-pre, bf-llama-mix, hf-llama, bf-vit-pre, bf-vit-mix, timm-vit.

    With same_weights the reference models get blockforge's weights (for timing); without, each model
    is built alone so that nothing but the model is resident before a memory measurement.
    """
    torch.manual_seed(0)
    family = name.split("-")[1]
    if family == "llama":
        forward = lambda m, x: m(x)  # noqa: E731
        if name == "hf-llama":
            from transformers import LlamaConfig, LlamaForCausalLM

            if same_weights:
                model = to_hf_llama(blockforge.build_model(ModelSpec(**LLAMA)))
            else:
                config = LlamaConfig(
                    hidden_size=LLAMA["width"], num_hidden_layers=LLAMA["depth"], num_attention_heads=LLAMA["heads"],
                    intermediate_size=LLAMA["ffn"], vocab_size=LLAMA["vocab"], max_position_embeddings=LLAMA["context"],
                )
                model = LlamaForCausalLM(config)
            model.config._attn_implementation = "sdpa"
            forward = lambda m, x: m(x).logits  # noqa: E731
        elif name == "bf-llama-mix":
            model = blockforge.build_model(ModelSpec(**LLAMA, layers=LayerRules(mix_ln=MixLN(alpha=0.25))))
        else:
            model = blockforge.build_model(ModelSpec(**LLAMA, layers=LayerRules(default=LayerSettings(placement="pre"))))

        def make_batch(batch: int):
            return torch.randint(0, LLAMA["vocab"], (batch, LLAMA["context"] + 1), device=device)

        def loss_fn(m, tokens):
            logits = forward(m, tokens[:, :-1])
            return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    else:
        from timm.models.vision_transformer import VisionTransformer

        timm_model = VisionTransformer(  # built first in every case, so all three draw the same RNG
            img_size=VIT["image_size"], patch_size=VIT["patch_size"], num_classes=VIT["classes"], embed_dim=VIT["width"],
            depth=VIT["depth"], num_heads=VIT["heads"], mlp_ratio=VIT["ffn"] / VIT["width"],
        )
        if name == "timm-vit":
            model = timm_model
        elif name == "bf-vit-mix":
            model = blockforge.build_model(ModelSpec(**VIT, layers=LayerRules(mix_ln=MixLN(alpha=0.25))))
        elif same_weights:
            model = from_timm_vit(timm_model)
        else:
            del timm_model
            model = blockforge.build_model(ModelSpec(**VIT))

        def make_batch(batch: int):
            return torch.randn(batch, 3, VIT["image_size"], VIT["image_size"], device=device), torch.randint(0, VIT["classes"], (batch,), device=device)

        def loss_fn(m, batch):
            images, labels = batch
            return F.cross_entropy(m(images).float(), labels)

    return model.to(device=device, dtype=dtype).train(), make_batch, loss_fn


def step(model, loss_fn, batch, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    loss = loss_fn(model, batch)
    loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def peak_memory(name: str, args) -> float:
    """Peak bytes one forward+backward adds, measured in a fresh process."""
    code = (
        "import json, sys\n"
        "sys.argv = ['x'] + json.loads(sys.argv[1])\n"
        "import benchmarks.step_time as b\n"
        "print(json.dumps(b.measure_memory_here()))\n"
    )
    argv = [name, "--batch", str(args.batch), "--device", args.device, "--dtype", args.dtype, "--threads", str(args.threads)]
    done = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _status_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_memory_here() -> float:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, make_batch, loss_fn = build(args.name, args.device, getattr(torch, args.dtype), same_weights=False)
    batch = make_batch(args.batch)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(model, loss_fn, batch, args.device)
        return float(torch.cuda.max_memory_allocated() - base)
    # Linux keeps ru_maxrss across exec (it would report the parent's peak); reset this process's
    # high-water mark instead and read it back after the step.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status_kib("VmRSS")
    step(model, loss_fn, batch, args.device)
    return float(_status_kib("VmHWM") - base) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=min(2, torch.get_num_threads()))
    parser.add_argument("--compile", action="store_true", help="compile: blockforge per block (train.compile), the references whole")
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    groups = {"llama": ["bf-llama-pre", "bf-llama-mix", "hf-llama"], "vit": ["bf-vit-pre", "bf-vit-mix", "timm-vit"]}
    for family, names in groups.items():
        built = {n: build(n, args.device, dtype) for n in names}
        if args.compile:
            from blockforge.train.speed import compile_blocks

            for n, (m, mb, lf) in list(built.items()):
                if n.startswith("bf-"):
                    compile_blocks(m)
                else:
                    built[n] = (torch.compile(m), mb, lf)
        batch = built[names[0]][1](args.batch)
        times: dict[str, list[float]] = {n: [] for n in names}
        for n in names:  # warm-up (and compile)
            start = time.perf_counter()
            for _ in range(2):
                step(built[n][0], built[n][2], batch, args.device)
            if args.compile:
                print(f"  {n}: first two steps (compile included) {time.perf_counter() - start:.1f} s")
        for r in range(args.rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                times[n].append(step(built[n][0], built[n][2], batch, args.device))
        median = {n: statistics.median(t) for n, t in times.items()}
        # Per-round ratios: the two steps of a round ran back to back, so slow drifts of the machine cancel.
        paired = {
            "ours/ref": sorted(a / b for a, b in zip(times[names[0]], times[names[2]])),
            "mix/pre": sorted(a / b for a, b in zip(times[names[1]], times[names[0]])),
        }
        memory = {} if args.no_memory else {n: peak_memory(n, args) for n in names}
        ours_pre, ours_mix, ref = names
        print(f"\n{family}: batch {args.batch}, {args.device} {args.dtype}, {args.threads} threads{', compiled' if args.compile else ''}")
        for n in names:
            mem = f"  peak +{memory[n] / 2**20:7.1f} MiB" if memory else ""
            print(f"  {n:14s} {median[n] * 1000:8.1f} ms/step{mem}")
        for label, key, a, b in ((f"blockforge-pre / {ref}", "ours/ref", ours_pre, ref), ("mix-ln / pre", "mix/pre", ours_mix, ours_pre)):
            r = paired[key]
            q1, q3 = r[len(r) // 4], r[(3 * len(r)) // 4]
            print(f"  time   {label + ':':27s} {median[a] / median[b]:.3f}  (per-round median {statistics.median(r):.3f}, quartiles {q1:.3f}-{q3:.3f})")
        if memory:
            print(f"  memory blockforge-pre / {ref}: {memory[ours_pre] / memory[ref]:.3f}")
            print(f"  memory mix-ln / pre:          {memory[ours_mix] / memory[ours_pre]:.3f}")


if __name__ == "__main__":
    main()

"""`blockforge inspect`: the resolved per-layer table of a recipe, parameter counts and the memory plan."""

from __future__ import annotations

import argparse
from collections import Counter

from blockforge.tables import text_table


def add_parser(sub) -> None:
    from blockforge.cli.common import add_set, positive_int

    p = sub.add_parser("inspect", help="print the resolved per-layer table of a recipe")
    p.add_argument("recipe", help="a recipe YAML file")
    add_set(p)
    p.add_argument("--memory", action="store_true", help="also print the training memory plan (computed on the meta device)")
    p.add_argument("--gpus", type=positive_int, default=1, help="GPUs the plan spreads over (with --fsdp)")
    p.add_argument("--fsdp", action="store_true", help="plan for weights, gradients and optimizer state sharded over --gpus")
    p.set_defaults(func=run)


def human_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def run(args: argparse.Namespace) -> int:
    from blockforge.cli.common import load_recipe_with_sets
    from blockforge.spec.family import get_family

    recipe = load_recipe_with_sets(args.recipe, args.overrides)  # a bad recipe is refused before torch is imported
    spec = recipe.spec

    import torch

    from blockforge.nn.build import build_model, layer_parameter_counts, parameter_count
    from blockforge.train.memory import machine_memory

    model = build_model(spec, device="meta")  # counts only: nothing is allocated
    per_layer = layer_parameter_counts(model)
    headers, rows = spec.layer_table()
    print(text_table(headers + ["params"], [row + [f"{n:,}"] for row, n in zip(rows, per_layer)], "rl" + "r" * (len(headers) - 1)))
    total = parameter_count(model)
    blocks = sum(per_layer)
    counts = Counter(layer.placement_name for layer in spec.layers)
    print()
    print(f"family       {spec.family} (width {spec.width}, depth {spec.depth}, norm {spec.norm}, attention {spec.attention})")
    default_bias = get_family(spec.family).default_bias
    other = [f"{key} {getattr(spec, key)}" for key in ("qkv_bias", "proj_bias", "mlp_bias") if getattr(spec, key) != default_bias]
    if spec.parametrization != "standard":
        bases = [f"base width {spec.base_width} (m {spec.width_ratio:.4g})" if spec.width_ratio != 1.0 or spec.base_width else "",
                 f"base depth {spec.base_depth}, alpha {spec.depth_alpha:g}" if spec.parametrization == "completep" else "",
                 f"attention scale {spec.attention_scale}"]
        other.append(f"{spec.parametrization} ({', '.join(b for b in bases if b)})")
    for key, plain in (("norm_weight_offset", 0.0), ("embed_scale", 1.0), ("residual_multiplier", 1.0), ("logit_multiplier", 1.0),
                       ("logit_softcap", None)):
        if getattr(spec, key) != plain:
            other.append(f"{key} {getattr(spec, key):g}")
    if spec.rope_scaling:
        other.append(f"rope scaling {spec.rope_scaling['type']} x{spec.rope_scaling['factor']:g}")
    if other:
        print("model        " + ", ".join(other))
    print("placements   " + ", ".join(f"{name} x{n}" for name, n in counts.items()))
    print(f"parameters   {total:,} ({human_count(total)}); blocks {blocks:,}, other {total - blocks:,}")
    print(f"arch hash    {spec.arch_hash()}")
    if spec.parametrization != "standard":
        print()
        print(text_table([f"{spec.parametrization}: parameter group", "init std", "lr", "Adam eps", "weight decay", "forward"],
                         spec.transfer_factors(), "lrrrrr"))
    states = 16 * total  # float32 weights and gradients, Adam's two moments
    room = machine_memory(torch.device("cpu"))
    if room is not None and states > room[0]:
        print(f"memory       training needs {states / 2**30:,.1f} GiB for weights, gradients and Adam moments alone, more than the "
              f"{room[0] / 2**30:,.1f} GiB {room[1]}: it needs larger hardware, or sharding (--fsdp --gpus N plans it)")
    if args.memory:
        from blockforge.train.memory import memory_plan

        plan = memory_plan(recipe, gpus=args.gpus, sharded=args.fsdp)
        print()
        print(text_table(["memory plan (meta device, nothing allocated)", "size", ""], plan.rows(), "lrl"))
    return 0

"""What a candidate costs, for searches with a cost axis: computed from the resolved spec (no training), or
measured once per distinct model on the trial's device and cached by its architecture hash.

Computed (from the model built on the meta device; blockforge.nn.flops counts the FLOPs):
  parameters, non_embedding_parameters
  train_flops_per_token      training FLOPs (forward and backward) per token at the context length
  inference_flops_per_token  forward FLOPs of one generated token at the context length, a KV cache holding
                             the earlier ones: 2 * (blocks' and head's weights) + 4 * sum_l heads_l * head_dim_l * min(window_l, T)
  kv_cache_bytes             the KV cache of one sequence that has reached the context length, bf16:
                             sum_l 2 * kv_heads_l * head_dim_l * held_l * 2, held_l = T, or min(window_l - 1, T) for a layer
                             with a sliding window (the next position sees those and itself): what blockforge's generate
                             and transformers' caches hold
  peak_train_memory_bytes    the training memory plan of one process (blockforge.train.memory, on the meta device)
Measured (on the trial's device, at the recipe's micro batch; higher is better):
  train_tokens_per_s, generate_tokens_per_s
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from blockforge.io import atomic_write_json
from blockforge.spec.search import COMPUTED_COSTS as COMPUTED, COSTS, MEASURED_COSTS as MEASURED  # noqa: F401 (COSTS: name -> direction)

KV_BYTES = 2  # bf16 keys and values


def computed_costs(recipe, names: tuple[str, ...] = COMPUTED) -> dict[str, float]:
    """The computed costs `names` of `recipe`'s model (nothing is allocated)."""
    from blockforge.nn.build import build_model
    from blockforge.nn.flops import model_costs

    spec = recipe.spec
    model = build_model(spec, device="meta")
    costs = model_costs(model)
    out: dict[str, float] = {"parameters": costs.parameters, "non_embedding_parameters": costs.non_embedding,
                             "train_flops_per_token": costs.train_flops_per_token}
    length = costs.sequence
    seen = [min(layer.window or length, length) for layer in spec.layers]  # the keys a new position attends over
    held = [length if layer.window is None else min(layer.window - 1, length) for layer in spec.layers]  # kept between positions
    out["kv_cache_bytes"] = sum(2 * layer.kv_heads * layer.head_dim * n * KV_BYTES for layer, n in zip(spec.layers, held))
    linear = sum(m.weight.numel() for block in model.layers for m in block.modules() if type(m).__name__ == "Linear")
    head = model.head.in_features * model.head.out_features
    out["inference_flops_per_token"] = 2 * (linear + head) + sum(4 * layer.heads * layer.head_dim * n for layer, n in zip(spec.layers, seen))
    if "peak_train_memory_bytes" in names:
        from blockforge.train.memory import memory_plan

        out["peak_train_memory_bytes"] = memory_plan(recipe, device_type="cpu").total_per_gpu
    return {name: float(out[name]) for name in names}


def measured_costs(recipe, folder: Path, device: str = "cpu", steps: int = 5) -> dict[str, float]:
    """Training and generation tokens/s of `recipe`'s model on `device`, measured once per architecture and
    micro batch and cached in `folder` (costs/<hash>-<device>.json)."""
    key = f"{recipe.spec.arch_hash()}-mb{recipe.train.micro_batch}-{device}"
    path = Path(folder) / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    import torch

    from blockforge.nn.build import build_model

    spec = recipe.spec
    model = build_model(spec, seed=0, device=device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, spec.vocab, (recipe.train.micro_batch, spec.context + 1), device=device)
    times = []
    for step in range(steps + 2):  # two warm-up steps
        started = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step >= 2:
            times.append(time.perf_counter() - started)
    train = recipe.train.micro_batch * spec.context / (sum(times) / len(times))
    model.eval()
    length = min(8, spec.context // 2)
    prompt, new = tokens[:1, :length], min(32, spec.context - length)
    with torch.no_grad():
        model.generate(prompt, min(4, new), temperature=0)  # warm-up
        started = time.perf_counter()
        model.generate(prompt, new, temperature=0)
        generate = new / (time.perf_counter() - started)
    out = {"train_tokens_per_s": train, "generate_tokens_per_s": generate}
    atomic_write_json(path, out)
    return out


CANDIDATE_CAP = 4096  # combinations of probed values a cell is checked at before a search starts


def check_constraints(plan) -> None:
    """Refuse, before anything runs, a constraint no candidate can meet: each cell's candidates are its baselines and
    every combination of each searched dimension's probed values (every listed value, a range's two ends; when that
    makes more than CANDIDATE_CAP points, each value alone), their computed costs taken from the spec."""
    import itertools

    from blockforge.errors import SpecError

    if not plan.constraints:
        return
    names = tuple(plan.constraints)
    reached: dict[str, list[tuple[float, str]]] = {cost: [] for cost in names}
    cache: dict[str, dict[str, float]] = {}
    for cell in plan.cell_names():
        dims = plan.dimensions_in(cell)
        combos = list(itertools.islice(itertools.product(*(d.probes() for d in dims)), CANDIDATE_CAP + 1))
        points = ([dict(zip((d.key for d in dims), combo)) for combo in combos] if len(combos) <= CANDIDATE_CAP
                  else plan.probes(cell)) + [dict(b) for b in plan.baselines]
        for point in points:
            try:
                recipe = plan.recipe(plan.trial_overrides(plan.cell(cell), point))
            except SpecError:
                continue  # a point no model is built at: its trials fail, free
            key = f"{recipe.spec.arch_hash()}|{recipe.train.micro_batch}"
            if key not in cache:
                cache[key] = computed_costs(recipe, names)
            where = f"cell {cell}" + (", " + ", ".join(f"{k.rsplit('.', 1)[-1]} {v}" for k, v in point.items()) if point else "")
            for cost in names:
                reached[cost].append((cache[key][cost], where))
    for cost, (low, high) in plan.constraints.items():
        values = reached[cost]
        if not values or any((low is None or v >= low) and (high is None or v <= high) for v, _ in values):
            continue
        if high is not None and all(v > high for v, _ in values):
            value, where = min(values)
            raise SpecError(f"no candidate meets max {high:g}: the smallest {cost} any candidate reaches is {value:g} ({where}); raise the "
                            "bound or change the space", path=f"constraints.{cost}", file=plan.file)
        value, where = max(values)
        raise SpecError(f"no candidate meets min {low:g}" + (f" and max {high:g}" if high is not None else "")
                        + f": the largest {cost} any candidate reaches is {value:g} ({where}); change the bounds or the space",
                        path=f"constraints.{cost}", file=plan.file)

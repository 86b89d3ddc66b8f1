"""Coordinate checks (after microsoft/mup): does a parametrization keep activations and updates the same
size as a model grows?

For each size, a model is built from a spec and trained a few Adam steps on one fixed batch at one
learning rate. At every step (0 = initialisation) this records, on that batch, the RMS of the token
embedding output, of each block's output (the residual stream), of each sub-layer's branch output and of
the logits; and, for step t > 0, the RMS of the change since step 0 of each of those (how much training
moved them). Under a parametrization whose hyperparameters transfer, these stay about the same size
across widths (and depths); under the standard one, the changes grow with width at a fixed learning rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from blockforge.spec.model import ResolvedSpec


@dataclass
class CoordRecord:
    width: int
    depth: int
    step: int
    rms: dict[str, float] = field(default_factory=dict)  # where -> RMS of the activation there
    change: dict[str, float] = field(default_factory=dict)  # where -> RMS of its change since step 0 (step > 0)

    def summary(self, kind: str = "change") -> dict[str, float]:
        """embedding; the mean over blocks of block outputs (block) and of branch outputs (attn, mlp); the last
        block's output (stream: what the head reads); logits."""
        values = self.rms if kind == "rms" else self.change
        out = {}
        for group in ("embedding", "block", "attn", "mlp", "logits"):
            picked = [v for k, v in values.items() if k == group or k.startswith(group + ".")]
            if picked:
                out[group] = sum(picked) / len(picked)
        if f"block.{self.depth - 1}" in values:
            out["stream"] = values[f"block.{self.depth - 1}"]
        return out


def _capture(model) -> tuple[dict[str, torch.Tensor], list]:
    seen: dict[str, torch.Tensor] = {}
    hooks = []

    def keep(name):
        def hook(module, args, output):
            seen[name] = output.detach().float()
        return hook

    hooks.append(model.embed.register_forward_hook(keep("embedding")))
    for i, block in enumerate(model.layers):
        hooks.append(block.register_forward_hook(keep(f"block.{i}")))
        hooks.append(block.attn.branch.register_forward_hook(keep(f"attn.{i}")))
        hooks.append(block.mlp.branch.register_forward_hook(keep(f"mlp.{i}")))
    return seen, hooks


def coord_check(spec: ResolvedSpec, *, steps: int = 4, lr: float = 1e-2, batch: int = 8, seed: int = 0) -> list[CoordRecord]:
    """Train a llama built from `spec` `steps` Adam steps on one fixed batch; a CoordRecord per step (0 = init)."""
    from blockforge.nn.build import build_model
    from blockforge.train.optim import parameter_groups

    model = build_model(spec, seed=seed)
    model.train()
    groups = parameter_groups(model, spec, weight_decay=0.0)
    optimizer = torch.optim.Adam([{**g, "lr": lr * g["lr_mult"]} for g in groups], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, spec.vocab, (batch, spec.context + 1), generator=generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    seen, hooks = _capture(model)
    records, first = [], None
    try:
        for step in range(steps + 1):
            logits = model(inputs)
            now = {**seen, "logits": logits.detach().float()}
            record = CoordRecord(spec.width, spec.depth, step, {k: float(v.pow(2).mean().sqrt()) for k, v in now.items()})
            if first is None:
                first = {k: v.clone() for k, v in now.items()}
            else:
                record.change = {k: float((v - first[k]).pow(2).mean().sqrt()) for k, v in now.items()}
            records.append(record)
            if step == steps:
                break
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    finally:
        for hook in hooks:
            hook.remove()
    return records

"""Tiny models, batches and the shared tiny text recipe for the analysis tests."""

from pathlib import Path

import tiny_data
import torch

from blockforge.nn.build import build_model
from blockforge.spec import ModelSpec
from blockforge.spec.model import LayerRules, MixLN


def write_recipe(folder: Path, name: str = "tiny.yaml", **kwargs) -> Path:
    """The shared tiny recipe with the analysis tests' defaults: 10 steps, no micro-batching."""
    kwargs = {"steps": 10, "micro_batch_size": 4, **kwargs}
    return tiny_data.write_recipe(folder, name, **kwargs)


def _spec(fields: dict, alpha: float) -> ModelSpec:
    """Post-LN on the first floor(alpha * depth) layers, Pre-LN on the rest."""
    return ModelSpec(**fields, layers=LayerRules(mix_ln=MixLN(alpha=alpha)))


def tiny_llama(depth: int = 3, alpha: float = 0.34, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(_spec({**tiny_data.TINY_LLAMA, "depth": depth, "vocab": 64, "context": 16}, alpha))


def tiny_vit(depth: int = 3, seed: int = 0):
    torch.manual_seed(seed)
    fields = dict(family="vit", width=32, depth=depth, heads=2, ffn=64, image_size=8, patch_size=2, channels=1, classes=10)
    return build_model(_spec(fields, 0.34))


def token_batches(count: int = 3, rows: int = 4, length: int = 16, vocab: int = 64, seed: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (rows, length + 1), generator=generator) for _ in range(count)]


def image_batches(count: int = 3, rows: int = 5, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, 1, 8, 8, generator=generator), torch.randint(0, 10, (rows,), generator=generator)) for _ in range(count)]

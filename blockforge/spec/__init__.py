"""Specs: schema, strict loading, dotted overrides and resolution into one LayerSpec per layer."""

from blockforge.spec.model import LayerSpec, ModelSpec, ResolvedSpec
from blockforge.spec.recipe import Assignment, Recipe, apply_overrides, load_recipe, parse_assignment, read_composed, recipe_from_data
from blockforge.spec.resolve import mix_ln_count, resolve, select_layers
from blockforge.spec.serialize import load_spec, save_spec, spec_from_yaml, spec_to_yaml

__all__ = [
    "Assignment", "LayerSpec", "ModelSpec", "Recipe", "ResolvedSpec", "apply_overrides", "load_recipe", "load_spec",
    "mix_ln_count", "parse_assignment", "read_composed", "recipe_from_data", "resolve", "save_spec",
    "select_layers", "spec_from_yaml", "spec_to_yaml",
]

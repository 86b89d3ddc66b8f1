"""blockforge: depth-heterogeneous Transformers from a per-layer YAML spec, and searches over them."""

from blockforge.errors import BlockforgeError, DataError, SpecError
from blockforge.export import load
from blockforge.nn.build import build_model
from blockforge.spec import ModelSpec, Recipe, ResolvedSpec, load_recipe, resolve

__version__ = "0.1.0"

__all__ = ["BlockforgeError", "DataError", "ModelSpec", "Recipe", "ResolvedSpec", "SpecError", "build_model", "load", "load_recipe", "resolve"]

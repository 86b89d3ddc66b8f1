"""blockforge: depth-heterogeneous Transformers from a per-layer YAML spec, and searches over them."""

from blockforge import families  # noqa: F401  (registers the llama and vit families)
from blockforge.errors import BlockforgeError, DataError, SearchInterrupted, SpecError
from blockforge.export import load, save
from blockforge.families.hf_native import to_hf, to_hf_llama
from blockforge.families.llama_hf import from_hf, from_hf_llama
from blockforge.families.vit_timm import from_timm_vit
from blockforge.nn.build import build_model
from blockforge.search.api import CellAnswer, LawAnswer, Search, open_search, run_search
from blockforge.spec import ModelSpec, Recipe, ResolvedSpec, load_recipe, resolve

__version__ = "0.1.0"

__all__ = [
    "BlockforgeError", "CellAnswer", "DataError", "LawAnswer", "ModelSpec", "Recipe", "ResolvedSpec", "Search", "SearchInterrupted", "SpecError",
    "build_model", "from_hf", "from_hf_llama", "from_timm_vit", "load", "load_recipe", "open_search", "resolve", "run_search", "save",
    "to_hf", "to_hf_llama",
]

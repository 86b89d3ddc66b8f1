"""blockforge: depth-heterogeneous Transformers from a per-layer YAML spec, and searches over them.

Importing the package registers the model families (their declarations: no torch) and nothing else; each name below is
imported from its module when it is first used (blockforge/lazy.py), so a command that only reads a file, prints its
--help or refuses a key answers without waiting for torch.
"""

from blockforge import families  # noqa: F401  (registers the llama and vit families before any spec is checked)
from blockforge.lazy import exports

__version__ = "0.1.0"

_WHERE = {
    "BlockforgeError": "blockforge.errors", "DataError": "blockforge.errors", "SearchInterrupted": "blockforge.errors",
    "SpecError": "blockforge.errors",
    "load": "blockforge.export", "save": "blockforge.export",
    "to_hf": "blockforge.families.hf_native", "to_hf_llama": "blockforge.families.hf_native",
    "from_hf": "blockforge.families.llama_hf", "from_hf_llama": "blockforge.families.llama_hf",
    "from_timm_vit": "blockforge.families.vit_timm",
    "build_model": "blockforge.nn.build",
    "CellAnswer": "blockforge.search.api", "LawAnswer": "blockforge.search.api", "Search": "blockforge.search.api",
    "open_search": "blockforge.search.api", "run_search": "blockforge.search.api",
    "ModelSpec": "blockforge.spec", "Recipe": "blockforge.spec", "ResolvedSpec": "blockforge.spec", "load_recipe": "blockforge.spec",
    "resolve": "blockforge.spec",
}

__all__ = [
    "BlockforgeError", "CellAnswer", "DataError", "LawAnswer", "ModelSpec", "Recipe", "ResolvedSpec", "Search", "SearchInterrupted", "SpecError",
    "build_model", "from_hf", "from_hf_llama", "from_timm_vit", "load", "load_recipe", "open_search", "resolve", "run_search", "save",
    "to_hf", "to_hf_llama",
]

__getattr__, __dir__ = exports(__name__, _WHERE)

"""What a transformers folder needs so that transformers 4.57 reads it as 5.x does.

transformers 5 writes RoPE settings only as `rope_parameters` and names its tokenizer class `TokenizersBackend`.
transformers 4.57 knows neither: it reads `rope_theta` (default 10000) and `rope_scaling` (default none), so a
Llama 3 export would silently lose its base and its llama3 scaling there, and it cannot build the tokenizer at all.
Both readers accept the older keys too, so an export carries both: 5.x reads `rope_scaling` before
`rope_parameters` and the two say the same thing. Gemma 3 keeps its local layers' base in `rope_local_base_freq`.
Every export is loaded back with 5.x after this is written (hf_export.verify); the 4.57 side is tested in its own
virtual environment (tests/families/test_transformers_versions.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blockforge.families.conversion import ConversionError
from blockforge.io import atomic_write_text

# The oldest and newest transformers releases the exports are tested with.
OLDEST_READER = "4.57"
TOKENIZER_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}  # 5.x's name -> the name both versions know


def legacy_rope(config: dict[str, Any]) -> dict[str, Any]:
    """The 4.x keys (`rope_theta`, `rope_scaling`, Gemma 3's `rope_local_base_freq`) that say what `rope_parameters` says."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict):
        return {}
    if "full_attention" in params or "sliding_attention" in params:  # one set per layer type (Gemma 3)
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        if local.get("rope_type", "default") != "default":
            raise ConversionError(
                "the sliding layers' RoPE is scaled, which transformers 4.x cannot read for this class (it scales only the "
                "global layers); export it with a transformers 5 reader in mind, or remove rope_linear_factor from those layers")
        return {**_flat(full), "rope_local_base_freq": local.get("rope_theta", 10000.0)}
    return _flat(params)


def _flat(params: dict[str, Any]) -> dict[str, Any]:
    keys: dict[str, Any] = {"rope_theta": params["rope_theta"]} if "rope_theta" in params else {}
    scaling = {key: value for key, value in params.items() if key != "rope_theta"}
    if "partial_rotary_factor" in scaling:
        keys["partial_rotary_factor"] = scaling.pop("partial_rotary_factor")
    keys["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    return keys


def for_older_readers(folder: Path) -> None:
    """Add to `folder`'s config.json and tokenizer_config.json what transformers 4.57 needs to read them as 5.x does."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    legacy = legacy_rope(config)
    if legacy:
        atomic_write_text(config_path, json.dumps({**config, **legacy}, indent=2, sort_keys=True) + "\n")
    tokenizer_path = folder / "tokenizer_config.json"
    if tokenizer_path.is_file():
        settings = json.loads(tokenizer_path.read_text())
        changed = dict(settings)
        if settings.get("tokenizer_class") in TOKENIZER_CLASSES:
            changed["tokenizer_class"] = TOKENIZER_CLASSES[settings["tokenizer_class"]]
        extra = settings.get("extra_special_tokens")
        if isinstance(extra, list) and "additional_special_tokens" not in settings:  # 5.x's list; 4.x's name for it
            changed["additional_special_tokens"] = extra
            changed.pop("extra_special_tokens")
        if changed != settings:
            atomic_write_text(tokenizer_path, json.dumps(changed, indent=2, ensure_ascii=False) + "\n")

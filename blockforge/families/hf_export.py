"""`--format hf`: an exported llama as a transformers folder (config.json, model.safetensors, tokenizer, card).

A uniform Pre-LN RMSNorm llama with a final norm and the same heads and ffn in every layer becomes a
plain `LlamaForCausalLM` (families/llama_hf.py). Every other llama keeps blockforge's parameter names
and ships hf_remote/'s configuration and modeling files, registered in config.json's `auto_map` and
loaded with `trust_remote_code=True`; its config holds the resolved spec as read from the modules.

The tokenizer goes to the top of the folder, with the model's bos, eos and pad ids taken from it.
Before the files are moved into place, the staged folder is loaded back with transformers: every
weight must load (none newly initialized) and the logits must equal blockforge's within 1e-5.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn

from blockforge.data.tokenizer import load_tokenizer
from blockforge.errors import CorruptFolderError, DataError
from blockforge.io import read_json
from blockforge.families.conversion import ConversionError, TensorSource, check_same_outputs, probe_tokens
from blockforge.families.formats import ExportFormat, copy_records, front_matter, publish, staging
from blockforge.families.llama_hf import from_hf_llama, hf_llama_problems, to_hf_llama
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
AUTO_MAP = {
    "AutoConfig": "configuration_blockforge.BlockforgeLlamaConfig",
    "AutoModelForCausalLM": "modeling_blockforge.BlockforgeForCausalLM",
}
REMOTE_NORMS = ("rmsnorm", "layernorm", "dyt")  # what the modeling file holds
REMOTE_MODEL_TYPE = "blockforge_llama"  # configuration_blockforge.BlockforgeLlamaConfig.model_type


@dataclass(frozen=True)
class TokenIds:
    bos: int
    eos: int
    pad: int

    def config(self) -> dict:
        return {"bos_token_id": self.bos, "eos_token_id": self.eos, "pad_token_id": self.pad}


def check(spec: ResolvedSpec) -> None:
    used = [spec.norm] + [layer.norm for layer in spec.layers]
    other = next((norm for norm in used if norm not in REMOTE_NORMS), None)
    if other is not None:
        raise ConversionError(
            f"--format hf holds {', '.join(REMOTE_NORMS[:-1])} and {REMOTE_NORMS[-1]} llamas, and this one uses {other}; "
            "export it with --format blockforge, which blockforge.load reads"
        )


def plain(spec: ResolvedSpec) -> bool:
    """Whether the export is a plain LlamaForCausalLM (else it ships its modeling file)."""
    return not hf_llama_problems(spec)


def write(model: nn.Module, native_dir: Path, out_dir: Path, card: str) -> None:
    """The transformers folder of `model` (loaded from the native export `native_dir`) in `out_dir`."""
    tokenizer, ids = exported_tokenizer(native_dir, model.spec.context)
    with staging(out_dir) as stage:
        if plain(model.spec):
            hf_model, model_class = plain_llama(model, ids), None
        else:
            hf_model, model_class = remote_llama(model, ids), remote_class()
            for name in REMOTE_FILES:
                shutil.copyfile(REMOTE_DIR / name, stage / name)
        hf_model.config.blockforge_spec = yaml.safe_load(spec_to_yaml(model.spec))  # blockforge.load reads the folder back by it
        hf_model.save_pretrained(stage)
        tokenizer.save_pretrained(stage)
        copy_records(native_dir, stage)
        (stage / "README.md").write_text(front_matter(library_name="transformers", pipeline_tag="text-generation", tags="[blockforge]") + card)
        verify(stage, model, model_class, ids)
        publish(stage, out_dir)


def read(folder: Path) -> tuple[ResolvedSpec, dict | None] | None:
    """A transformers folder this format wrote, for blockforge.load: its spec (config.json's blockforge_spec, or the
    recipe.yaml beside it for folders written before that) and, for a plain LlamaForCausalLM, its weights converted to
    blockforge's names (its own modeling file's folders hold blockforge's names already). None for other folders."""
    config_path = folder / "config.json"
    if not config_path.is_file() or not (folder / "model.safetensors").is_file():
        return None
    config = read_json(config_path, "export the model again")
    ours = isinstance(config, dict) and ("blockforge_spec" in config or "blockforge_arch_hash" in config or (folder / "recipe.yaml").is_file())
    if not ours or config.get("model_type") not in ("llama", REMOTE_MODEL_TYPE):
        return None
    if isinstance(config.get("blockforge_spec"), dict):
        spec = spec_from_yaml(config["blockforge_spec"], file=f"{config_path}: blockforge_spec")
    elif (folder / "recipe.yaml").is_file():
        spec = recipe_from_data(read_yaml(folder / "recipe.yaml"), file=str(folder / "recipe.yaml")).spec
    else:
        raise CorruptFolderError(f"{folder}: a transformers folder with neither blockforge_spec in config.json nor recipe.yaml, so its "
                                 "blockforge spec is unknown; load it with transformers, or export the run again")
    if config["model_type"] == REMOTE_MODEL_TYPE:
        return spec, None
    from transformers import LlamaForCausalLM

    converted = from_hf_llama(LlamaForCausalLM.from_pretrained(folder))
    return spec, converted.state_dict()


def exported_tokenizer(native_dir: Path, context: int):
    """The run's tokenizer, prepared for the export, and the ids the model config takes from it.

    Without a bos token of its own, the end-of-text token becomes bos (every training document and every
    `blockforge generate` prompt starts after it); when the tokenizer adds no special tokens otherwise, it
    is saved to prepend that bos when asked for special tokens (`tokenizer(text)`), as those prompts do.
    """
    if not (native_dir / "tokenizer").is_dir():
        raise ConversionError("the run has no tokenizer/ folder, which a transformers export ships; put the tokenizer it was trained with there")
    try:
        tokenizer = load_tokenizer(native_dir / "tokenizer")
    except DataError:
        raise ConversionError("the run's tokenizer/ folder cannot be read, so its export could not encode text; check that folder") from None
    hf = tokenizer.hf
    if hf.bos_token is None:
        hf.bos_token = hf.convert_ids_to_tokens(tokenizer.eos_id)
        if adds_no_tokens(hf):
            hf.add_bos_token = True
            hf.init_kwargs["add_bos_token"] = True  # saved, so a reload rebuilds the same post-processor
    hf.init_kwargs.pop("local_files_only", None)  # how blockforge read it, not a property of the tokenizer
    hf.model_max_length = context
    return hf, TokenIds(bos=hf.bos_token_id, eos=tokenizer.eos_id, pad=tokenizer.pad_id)


def adds_no_tokens(hf) -> bool:
    """Whether the tokenizer's post-processor leaves encodings as they are (blockforge's own BPE)."""
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return False
    processor = json.loads(backend.to_str()).get("post_processor")
    return processor is None or (processor.get("type") == "TemplateProcessing" and not processor.get("special_tokens"))


def plain_llama(model: nn.Module, ids: TokenIds) -> nn.Module:
    hf_model = to_hf_llama(model)
    for key, value in ids.config().items():
        setattr(hf_model.config, key, value)
        setattr(hf_model.generation_config, key, value)
    return hf_model


def remote_class():
    from blockforge.families.hf_remote.modeling_blockforge import BlockforgeForCausalLM

    return BlockforgeForCausalLM


def remote_llama(model: nn.Module, ids: TokenIds) -> nn.Module:
    """The modeling file's model with `model`'s weights: every tensor copied under its own name, then compared."""
    from blockforge.families.hf_remote.configuration_blockforge import BlockforgeLlamaConfig

    config = BlockforgeLlamaConfig(**remote_config(model), **ids.config(), auto_map=dict(AUTO_MAP))
    hf_model = remote_class()(config)
    source = TensorSource(model, "this blockforge llama", into="the transformers model")
    targets = dict(hf_model.named_parameters(remove_duplicate=False))
    targets.update(hf_model.named_buffers(remove_duplicate=False))
    for name, tensor in targets.items():
        source.copy_into(tensor, name)
    source.finish()
    hf_model.generation_config.update(**ids.config())
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
        "tie_word_embeddings": model.head.weight is model.embed.weight,
        "readout_multiplier": float(model._logit_multiplier),  # muP's 1/m times logit_multiplier
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


def verify(stage: Path, model: nn.Module, model_class, ids: TokenIds) -> None:
    """Load the staged folder as a user will, and refuse unless every weight loads and the logits agree."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    loaded, info = (model_class or LlamaForCausalLM).from_pretrained(stage, output_loading_info=True)
    problems = {key: sorted(value)[:3] for key, value in info.items() if value}
    if problems:
        raise ConversionError(f"the written transformers folder does not load cleanly ({problems}); refused")
    tokens = probe_tokens(model.spec)
    with torch.no_grad():
        check_same_outputs(loaded.eval()(tokens).logits, model(tokens), "the written transformers folder", TOLERANCE, cause=CAUSE)
    tokenizer = AutoTokenizer.from_pretrained(stage, config=loaded.config)  # the config given: no remote-code question
    saved = TokenIds(bos=tokenizer.bos_token_id, eos=tokenizer.eos_token_id, pad=tokenizer.pad_token_id)
    configured = TokenIds(bos=loaded.config.bos_token_id, eos=loaded.config.eos_token_id, pad=loaded.config.pad_token_id)
    if not saved == configured == ids:
        raise ConversionError(f"the written tokenizer's ids {saved} differ from the model config's {configured}; refused")


def usage(spec: ResolvedSpec) -> str:
    remote = "" if plain(spec) else ", trust_remote_code=True"
    kind = (
        "a plain `LlamaForCausalLM` (query and key rows permuted to transformers' RoPE layout)" if plain(spec)
        else "blockforge's own layer stack, in the `modeling_blockforge.py` shipped in this folder (hence `trust_remote_code=True`)"
    )
    flag = "" if plain(spec) else " (the tokenizer needs the flag only to read config.json)"
    return f"""This folder is {kind}; its logits equal `blockforge.load`'s{flag}. Every training document followed an
end-of-text token, so a tokenizer without a bos token of its own was saved with that token as bos and prepends it.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

model = AutoModelForCausalLM.from_pretrained("path/to/this/folder"{remote})
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder"{remote})
inputs = tokenizer("The model", return_tensors="pt")
print(tokenizer.decode(model.generate(**inputs, max_new_tokens=40, do_sample=False)[0], skip_special_tokens=True))

generator = pipeline("text-generation", model="path/to/this/folder"{remote})
print(generator("The model", max_new_tokens=40)[0]["generated_text"])
```
"""


HF_FORMAT = ExportFormat(name="hf", library="transformers", check=check, usage=usage, write=write, read=read)

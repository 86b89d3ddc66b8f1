"""`--format gguf`: a llama that llama.cpp's `llama` architecture computes, as one GGUF file (model.gguf) with its
tokenizer, for llama.cpp, llama-cpp-python, Ollama and LM Studio.

Only a plain LlamaForCausalLM-shaped llama fits (uniform Pre-LN RMSNorm, SwiGLU, RoPE without scaling, one head
layout, no biases): anything else is refused by name before anything is written (a Mix-LN model's Post-LN layers
have no llama.cpp equivalent). blockforge rotates adjacent pairs of each head, which is llama.cpp's own RoPE layout
for this architecture, so the q and k rows are written as they are (a transformers export permutes them).

The tokenizer goes in as llama.cpp's byte-level BPE (`gpt2` model, `gpt-2` pre-tokenizer: the same split as
blockforge's BPE, whose tokenizers pre-tokenizer is GPT-2's regex), with its merges and special tokens; bos is
added as the transformers export adds it. llama.cpp's own converter cannot do this for a trained export: it
recognizes a BPE by hashing the ids of a probe text, and blockforge's vocabulary is its own. What llama.cpp then
computes is checked in the slow suite (tests/families/test_served.py) with llama-cpp-python; here the file is read
back and every tensor compared with the model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from blockforge.families.conversion import ConversionError
from blockforge.families.formats import ExportFormat, copy_records, front_matter, publish, staging
from blockforge.families.hf_native import llama_cpp_problems
from blockforge.spec.model import ResolvedSpec

FILE = "model.gguf"
TYPES = {torch.float32: "F32", torch.float16: "F16"}  # the precisions a GGUF file holds here


def check(spec: ResolvedSpec) -> None:
    found = llama_cpp_problems(spec)
    if found:
        raise ConversionError(f"--format gguf holds what llama.cpp's llama architecture computes (a uniform Pre-LN RMSNorm llama), "
                              f"and {'; '.join(found)}; export it with --format hf")


def tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s weights under llama.cpp's names (float32, on the CPU)."""
    spec: ResolvedSpec = model.spec
    out = {"token_embd.weight": model.embed.weight, "output_norm.weight": model.final_norm.weight}
    if not spec.tie_embeddings:
        out["output.weight"] = model.head.weight
    for i, (block, layer) in enumerate(zip(model.layers, spec.layers)):
        attn, mlp = block.attn.branch, block.mlp.branch
        q, k, v = attn.qkv.weight.split([layer.heads * layer.head_dim, layer.kv_heads * layer.head_dim, layer.kv_heads * layer.head_dim])
        gate, up = mlp.gate_up.weight.chunk(2)
        out.update({f"blk.{i}.attn_norm.weight": block.attn.in_norm.weight, f"blk.{i}.attn_q.weight": q, f"blk.{i}.attn_k.weight": k,
                    f"blk.{i}.attn_v.weight": v, f"blk.{i}.attn_output.weight": attn.proj.weight,
                    f"blk.{i}.ffn_norm.weight": block.mlp.in_norm.weight, f"blk.{i}.ffn_gate.weight": gate,
                    f"blk.{i}.ffn_up.weight": up, f"blk.{i}.ffn_down.weight": mlp.down.weight})
    return {name: tensor.detach().to("cpu", torch.float32).contiguous() for name, tensor in out.items()}


def vocabulary(native_dir: Path, size: int) -> tuple[list[str], list[int], list[str], dict[str, int | None]]:
    """(tokens by id, their GGUF types, merges, bos/eos/pad ids) of the export's tokenizer, padded to the model's rows."""
    import gguf

    from blockforge.data.tokenizer import load_tokenizer
    from blockforge.families.hf_export import blockforge_bpe, exported_tokenizer

    tokenizer = load_tokenizer(native_dir / "tokenizer") if (native_dir / "tokenizer").is_dir() else None
    if tokenizer is None or not blockforge_bpe(native_dir, tokenizer.hf):
        raise ConversionError("--format gguf writes blockforge's own byte-level BPE, and this model was trained with another tokenizer; "
                              "export it with --format hf and convert that with llama.cpp's convert_hf_to_gguf.py, which knows the "
                              "tokenizers of released models")
    backend = json.loads(tokenizer.hf.backend_tokenizer.to_str())
    vocab, special = backend["model"]["vocab"], {t["id"] for t in backend.get("added_tokens", []) if t.get("special")}
    if len(vocab) > size:
        raise ConversionError(f"the tokenizer has {len(vocab)} tokens and the model {size} embedding rows; export a model whose vocab holds them")
    by_id = {index: token for token, index in vocab.items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(size)]
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED for i in range(size)]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in backend["model"]["merges"]]
    ids = exported_tokenizer(native_dir, tokenizer.hf.model_max_length, {}).ids
    return tokens, [int(t) for t in types], merges, {"bos": ids.bos, "eos": ids.eos, "pad": ids.pad}


def write(model: nn.Module, native_dir: Path, out_dir: Path, card: str, dtype: torch.dtype | None = None) -> None:
    """model.gguf of `model` (loaded from the native export `native_dir`) in `out_dir`, its matrices at `dtype` (default float32;
    norms stay float32, as llama.cpp keeps them)."""
    import gguf

    spec: ResolvedSpec = model.spec
    dtype = dtype or torch.float32
    if dtype not in TYPES:
        raise ConversionError(f"--format gguf writes fp32 or fp16 matrices, not {str(dtype).removeprefix('torch.')}")
    layer = spec.layers[0]
    weights = tensors(model)
    tokens, types, merges, ids = vocabulary(native_dir, spec.vocab)
    with staging(out_dir) as stage:
        writer = gguf.GGUFWriter(str(stage / FILE), "llama")
        writer.add_name(native_dir.name)
        writer.add_context_length(spec.context)
        writer.add_embedding_length(spec.width)
        writer.add_block_count(spec.depth)
        writer.add_feed_forward_length(layer.ffn)
        writer.add_head_count(layer.heads)
        writer.add_head_count_kv(layer.kv_heads)
        writer.add_key_length(layer.head_dim)
        writer.add_value_length(layer.head_dim)
        writer.add_rope_dimension_count(layer.head_dim)
        writer.add_rope_freq_base(spec.rope_theta)
        writer.add_layer_norm_rms_eps(spec.norm_eps)
        writer.add_vocab_size(spec.vocab)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == torch.float32 else gguf.LlamaFileType.MOSTLY_F16)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        for name, value in (("bos", ids["bos"]), ("eos", ids["eos"]), ("pad", ids["pad"])):
            if value is not None:
                getattr(writer, f"add_{name}_token_id")(value)
        writer.add_add_bos_token(ids["bos"] is not None)
        writer.add_add_eos_token(False)
        for name, tensor in weights.items():
            kept = torch.float32 if tensor.dim() == 1 else dtype
            writer.add_tensor(name, tensor.to(kept).numpy())
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        copy_records(native_dir, stage)
        (stage / "README.md").write_text(front_matter(library_name="gguf", pipeline_tag="text-generation", tags=["blockforge", "gguf"]) + card)
        verify(stage / FILE, weights, dtype)
        publish(stage, out_dir)


def verify(path: Path, weights: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """Read the written file back: every tensor there, under its name and shape, equal to the model's at `dtype`."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    held = {tensor.name: tensor for tensor in reader.tensors}
    if set(held) != set(weights):
        raise ConversionError(f"{path.name} holds tensors {sorted(set(held) ^ set(weights))[:3]} unlike the model; refused")
    for name, tensor in weights.items():
        kept = torch.float32 if tensor.dim() == 1 else dtype
        stored = np.asarray(held[name].data).reshape(tuple(tensor.shape))
        if not np.array_equal(stored, tensor.to(kept).numpy()):
            raise ConversionError(f"{path.name}: tensor {name} reads back different from the model's; refused")


def usage(spec: ResolvedSpec, native_dir: Path) -> str:
    return f"""This folder holds `{FILE}`, the model as llama.cpp's `llama` architecture with blockforge's byte-level BPE (llama.cpp's
`gpt2` tokenizer, `gpt-2` pre-tokenizer; bos added as the transformers export adds it). Tested with llama-cpp-python:
greedy tokens equal to transformers'.

```bash
llama-cli -m path/to/this/folder/{FILE} -p "The model" -n 40 --temp 0
```

```python
from llama_cpp import Llama
llm = Llama("path/to/this/folder/{FILE}")
print(llm("The model", max_tokens=40, temperature=0.0)["choices"][0]["text"])
```
"""


GGUF_FORMAT = ExportFormat(name="gguf", library="llama.cpp", check=check, usage=usage, write=write)

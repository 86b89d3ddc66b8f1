"""`--format gguf`: a uniform Pre-LN llama as llama.cpp's `llama` architecture with blockforge's BPE, or a refusal by name.
(What llama.cpp computes from the file is checked in test_served.py, slow.)"""

import json

import gguf
import numpy as np
import pytest
import torch

import blockforge
from blockforge.cli import main
from blockforge.export import export_run
from blockforge.spec import ModelSpec
from blockforge.spec.model import LayerRules, LayerSettings, MixLN

VOCAB = 320  # more rows than the BPE of conftest.py has tokens (300): the rest are written as unused


def llama(**kw) -> ModelSpec:
    settings = dict(family="llama", width=64, depth=3, heads=4, kv_heads=2, ffn=96, vocab=VOCAB, context=32)
    settings.update(kw)
    return ModelSpec(**settings)


def field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def test_a_pre_ln_llama_is_written_with_its_tokenizer_and_reads_back(model_folder, tmp_path, bpe):
    src = model_folder(llama())
    reader = gguf.GGUFReader(str(export_run(src, tmp_path / "gguf", format="gguf") / "model.gguf"))
    assert field(reader, "general.architecture") == "llama"
    assert (field(reader, "llama.block_count"), field(reader, "llama.attention.head_count"), field(reader, "llama.attention.head_count_kv")) == (3, 4, 2)
    assert (field(reader, "tokenizer.ggml.model"), field(reader, "tokenizer.ggml.pre")) == ("gpt2", "gpt-2")
    tokens = field(reader, "tokenizer.ggml.tokens")
    vocab = json.loads(bpe.hf.backend_tokenizer.to_str())["model"]["vocab"]
    assert len(tokens) == VOCAB and all(tokens[i] == token for token, i in vocab.items())
    types = field(reader, "tokenizer.ggml.token_type")
    assert types[bpe.eos_id] == gguf.TokenType.CONTROL and types[VOCAB - 1] == gguf.TokenType.UNUSED
    assert field(reader, "tokenizer.ggml.bos_token_id") == bpe.eos_id and field(reader, "tokenizer.ggml.add_bos_token") is True
    # blockforge's q rows are already in llama.cpp's RoPE layout (adjacent pairs): written as they are
    model = blockforge.load(src)
    q = next(t for t in reader.tensors if t.name == "blk.1.attn_q.weight")
    expected = model.layers[1].attn.branch.qkv.weight[: 4 * 16].detach().numpy()
    assert np.array_equal(np.asarray(q.data).reshape(expected.shape), expected)


def test_fp16_matrices_keep_float32_norms(model_folder, tmp_path):
    out = export_run(model_folder(llama()), tmp_path / "gguf", format="gguf", dtype="fp16")
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(str(out / "model.gguf")).tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16 and types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32


@pytest.mark.parametrize("spec, named", [
    (llama(layers=LayerRules(default=LayerSettings(placement="pre"), mix_ln=MixLN(alpha=0.34))), "Pre-LN"),
    (llama(qkv_bias=True, proj_bias=True), "biases"),
    (llama(norm="layernorm"), "layernorm"),
])
def test_what_llama_cpp_cannot_compute_is_refused_by_name_before_writing(model_folder, tmp_path, capsys, spec, named):
    src = model_folder(spec)
    assert main(["export", str(src), "--out", str(tmp_path / "gguf"), "--format", "gguf"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and named in err and "--format hf" in err
    assert not (tmp_path / "gguf").exists()


def test_bf16_is_refused(model_folder, tmp_path, capsys):
    assert main(["export", str(model_folder(llama())), "--out", str(tmp_path / "gguf"), "--format", "gguf", "--dtype", "bf16"]) == 2
    assert "fp32 or fp16" in capsys.readouterr().err

"""Transformers folders blockforge exported, damaged or edited afterwards: `blockforge.load` and `generate` refuse each
in one sentence naming what is wrong, never computing with random or different weights."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import blockforge
from blockforge.cli import main
from blockforge.errors import BlockforgeError
from blockforge.export import export_run
from blockforge.spec import ModelSpec
from blockforge.spec.model import LayerOverride, LayerRules, LayerSettings, MixLN

FORMS = {  # a class of transformers' own, and the remote-code form
    "LlamaForCausalLM": ModelSpec(family="llama", width=32, depth=2, heads=2, ffn=64, vocab=300, context=32),
    "remote code": ModelSpec(family="llama", width=32, depth=2, heads=2, ffn=64, vocab=300, context=32,
                             layers=LayerRules(default=LayerSettings(placement="pre"), mix_ln=MixLN(alpha=0.5))),
}


@pytest.fixture(params=list(FORMS))
def exported(request, model_folder, tmp_path):
    return export_run(model_folder(FORMS[request.param]), tmp_path / "hf", format="hf")


def refused(folder, needle, capsys):
    with pytest.raises(BlockforgeError, match=needle) as raised:
        blockforge.load(folder)
    capsys.readouterr()
    assert main(["generate", str(folder), "--prompt", "The", "--max-new-tokens", "2"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and "\n" not in err and "Traceback" not in err and str(raised.value) in err


def test_a_tensor_missing_from_the_weights_is_refused(exported, capsys):
    weights = load_file(exported / "model.safetensors")
    name = next(n for n in weights if "mlp" in n and "down" in n)
    del weights[name]
    save_file(weights, exported / "model.safetensors", metadata={"format": "pt"})
    refused(exported, r"no (weights for|tensor) .*down", capsys)


def test_truncated_weights_are_one_sentence(exported, capsys):
    data = (exported / "model.safetensors").read_bytes()
    (exported / "model.safetensors").write_bytes(data[: len(data) // 2])
    refused(exported, r"model\.safetensors", capsys)


def test_missing_weights_are_named_as_missing(exported, capsys):
    (exported / "model.safetensors").unlink()
    refused(exported, r"model\.safetensors is missing", capsys)


def test_a_config_edited_after_export_is_refused(exported, capsys):
    config = json.loads((exported / "config.json").read_text())
    if "rope_parameters" in config:
        config["rope_parameters"]["rope_theta"] = 12345.0
    else:
        config["rope_theta"] = 12345.0
    (exported / "config.json").write_text(json.dumps(config))
    refused(exported, r"config\.json.* (differs from|says something other than) the blockforge_spec it carries .*rope", capsys)


def test_a_tokenizer_file_missing_or_damaged_is_named_with_its_fix(model_folder, tmp_path, capsys):
    """The tokenizer's vocabulary (tokenizer.json) deleted: load and generate name it, not transformers' lines on what it
    could not instantiate; a tokenizer file cut short: generate names the file, not a line and column of no file. (One
    form: both ship the same tokenizer.)"""
    exported = export_run(model_folder(FORMS["LlamaForCausalLM"]), tmp_path / "hf", format="hf")
    vocabulary = exported / "tokenizer.json"
    kept = vocabulary.read_bytes()
    vocabulary.unlink()
    refused(exported, rf"{vocabulary}: is missing, and the tokenizer saved beside it \(tokenizer_config.json\) cannot encode text "
                      "without it; copy it back from the run or model folder this one was written from, or export the model again", capsys)
    for damaged in (vocabulary, exported / "tokenizer_config.json"):
        vocabulary.write_bytes(kept)
        damaged.write_bytes(damaged.read_bytes()[:100])
        assert main(["generate", str(exported), "--prompt", "The", "--max-new-tokens", "2"]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1 and f"{damaged}: is not valid JSON" in captured.err, captured.err


def test_an_untouched_export_loads_and_computes_what_it_did(exported):
    tokens = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert blockforge.load(exported)(tokens).shape == (1, 10, 300)


EDITS = [  # (what is edited, in which file, the value, what the sentence names)
    ("num_hidden_layers", "config.json", 0, r"config\.json.*num_hidden_layers.* 0"),
    ("num_hidden_layers", "config.json", 1000, r"config\.json.*(num_hidden_layers: 1000|layers: 1000 of them)"),
    ("num_hidden_layers", "config.json", "abc", r"config\.json.*num_hidden_layers.*abc"),
    ("max_position_embeddings", "config.json", 0, r"config\.json.*max_position_embeddings.* 0"),
    ("vocab_size", "config.json", 10**12, r"config\.json.*vocab(_size)?: 1000000000000, the spec gives 300"),
    ("num_attention_heads", "config.json", 1, r"config\.json.*(num_attention_heads: 1|kv_heads 2 must divide heads 1)"),
    ("rms_norm_eps", "config.json", 0.5, r"config\.json.*(holds rms_norm_eps|norm_eps: 0\.5)"),
    ("dtype", "config.json", "bogus", r'config\.json: dtype is "bogus", which names no precision'),
    (None, "generation_config.json", [1, 2], r"generation_config\.json: holds a list, not a mapping"),
]


@pytest.mark.parametrize("key,file,value,needle", EDITS, ids=[f"{k or f}={v}" for k, f, v, _ in EDITS])
def test_an_edited_config_is_refused_naming_the_file_and_key_not_the_weights_or_tokenizer(exported, capsys, key, file, value, needle):
    path = exported / file
    if key is None:
        path.write_text(json.dumps(value))
    else:
        data = json.loads(path.read_text())
        data[key] = value
        path.write_text(json.dumps(data))
    refused(exported, needle, capsys)


def test_the_card_of_a_remote_code_export_says_what_keeps_it_from_fixed_layouts(model_folder, tmp_path):
    windows = ModelSpec(family="llama", width=32, depth=2, heads=2, ffn=64, vocab=300, context=32,
                        layers=LayerRules(default=LayerSettings(placement="pre"),
                                          overrides=[LayerOverride(at=0, window=8), LayerOverride(at=1, window=16)]))
    for name, spec, says, never in (("mix", FORMS["remote code"], "not every sub-layer is Pre-LN", "window"),
                                    ("windows", windows, "it has sliding windows", "Post-LN")):
        folder = export_run(model_folder(spec, name=f"{name}-run"), tmp_path / name, format="hf")
        line = next(line for line in (folder / "README.md").read_text().splitlines() if line.startswith("- llama.cpp"))
        assert says in line and never not in line, line


def test_force_replaces_an_earlier_gguf_export(model_folder, tmp_path):
    run = model_folder(FORMS["LlamaForCausalLM"], name="run")
    export_run(run, tmp_path / "gguf", format="gguf")
    export_run(run, tmp_path / "gguf", format="gguf", dtype="fp16", force=True)
    assert (tmp_path / "gguf" / "model.gguf").is_file()

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
from blockforge.spec.model import LayerRules, LayerSettings, MixLN

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


def test_an_untouched_export_loads_and_computes_what_it_did(exported):
    tokens = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert blockforge.load(exported)(tokens).shape == (1, 10, 300)

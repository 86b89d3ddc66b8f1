"""`--format timm`: a uniform Pre-LN vit loads into timm's VisionTransformer, every tensor used; any other vit is refused."""

import json

import pytest
import timm
import torch
from safetensors.torch import load_file

import blockforge
from blockforge.cli import main
from blockforge.errors import BlockforgeError
from blockforge.export import export_run
from blockforge.spec import ModelSpec
from blockforge.spec.model import LayerOverride, LayerRules, LayerSettings, MixLN

TOL = 1e-4


def vit(placement="pre", *, mix=None, overrides=(), **kw):
    layers = LayerRules(default=LayerSettings(placement=placement), mix_ln=MixLN(alpha=mix) if mix else None, overrides=list(overrides))
    settings = dict(family="vit", width=48, depth=2, heads=3, ffn=100, image_size=16, patch_size=4, classes=7, layers=layers)
    settings.update(kw)
    return ModelSpec(**settings)


def largest_difference(timm_model, folder) -> float:
    spec = blockforge.load(folder).spec
    images = torch.randn(3, spec.channels, spec.image_size, spec.image_size, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        return (timm_model.eval()(images) - blockforge.load(folder)(images)).abs().max().item()


@pytest.mark.parametrize("final_norm,channels", [(True, 3), (False, 1)])
def test_a_uniform_pre_ln_vit_loads_into_timm_by_name_with_every_tensor(model_folder, tmp_path, final_norm, channels):
    src = model_folder(vit(final_norm=final_norm, channels=channels), tokenizer=False)
    out = export_run(src, tmp_path / "timm", format="timm")
    config = json.loads((out / "config.json").read_text())
    weights = out / "model.safetensors"
    # The call the model card documents.
    model = timm.create_model(config["architecture"], pretrained=True,
                              pretrained_cfg_overlay=dict(file=str(weights), num_classes=7), **config["model_args"])
    assert type(model).__name__ == "VisionTransformer"
    fresh = timm.create_model(config["architecture"], pretrained=False, **config["model_args"])
    report = fresh.load_state_dict(load_file(weights), strict=True)  # no missing or unexpected keys
    assert not report.missing_keys and not report.unexpected_keys
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in load_file(weights).items())
    assert largest_difference(model, src) <= TOL
    assert largest_difference(timm.create_model(f"local-dir:{out}", pretrained=True), src) <= TOL


def test_the_card_gives_the_create_model_call(model_folder, tmp_path):
    out = export_run(model_folder(vit(), tokenizer=False), tmp_path / "timm", format="timm")
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: timm\n")
    assert 'timm.create_model("local-dir:path/to/this/folder", pretrained=True)' in card
    assert "num_classes=7" in card and "embed_dim=48" in card and "mlp_ratio=" in card


@pytest.mark.parametrize("spec,needle", [
    (vit(mix=0.5), "placements post, pre"),
    (vit("sandwich"), "placements sandwich"),
    (vit("lns"), "placements lns"),
    (vit(overrides=[LayerOverride(at=1, heads=4)]), "heads, kv_heads, head_dim that differ between layers"),
    (vit(norm="rmsnorm"), "rmsnorm norms"),
    (vit(norm_eps=1e-5), "norm eps 1e-05"),
])
def test_any_other_vit_is_refused_in_one_sentence(model_folder, tmp_path, capsys, spec, needle):
    src = model_folder(spec, tokenizer=False)
    assert main(["export", str(src), "--out", str(tmp_path / "timm"), "--format", "timm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "timm's VisionTransformer cannot hold this vit" in err and needle in err and "blockforge.load" in err
    assert not (tmp_path / "timm").exists()


def test_a_llama_is_refused_for_timm(model_folder, tmp_path):
    llama = ModelSpec(family="llama", width=32, depth=2, heads=2, ffn=64, vocab=300, context=16)
    with pytest.raises(BlockforgeError, match="--format timm exports vit models, and this is a llama model"):
        export_run(model_folder(llama), tmp_path / "timm", format="timm")

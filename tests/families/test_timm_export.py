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
from tiny_data import tiny_llama

TOL = 1e-4
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


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


def test_timm_prepares_inputs_as_training_did(tmp_path):
    """A 1-channel digits run: resolve_data_config reads the training mean and std, and create_transform turns an 8x8
    grey image into the tensor training fed the model."""
    from PIL import Image

    from blockforge.data import dataset_for
    from blockforge.spec import load_recipe
    from blockforge.train.loop import train

    recipe = load_recipe(ROOT / "recipes/vit-digits-pre.yaml", [("train.steps", 2), ("train.eval_batches", 1), ("train.batch_size", 8)])
    train(recipe, tmp_path / "run", progress=False)
    out = export_run(tmp_path / "run", tmp_path / "timm", format="timm")
    model = timm.create_model(f"local-dir:{out}", pretrained=True)
    settings = timm.data.resolve_data_config({}, model=model)
    data = dataset_for(recipe)
    assert settings["input_size"] == (1, 8, 8) and settings["crop_pct"] == 1.0
    assert settings["mean"] == pytest.approx((data.mean,)) and settings["std"] == pytest.approx((data.std,))
    pixels = data.val_images[0, 0].long()  # 0..16
    image = Image.fromarray((pixels.numpy() * 255 // 16).astype("uint8"), mode="L")  # the same image as 8-bit grey
    prepared = timm.data.create_transform(**settings)(image)
    expected = ((pixels.float() * 255 // 16) / 255 - data.mean) / data.std  # training's normalization of those 8-bit pixels
    assert prepared.shape == (1, 8, 8)
    torch.testing.assert_close(prepared[0], expected, rtol=0, atol=1e-5)


def test_a_run_that_records_no_normalization_is_refused(model_folder, tmp_path):
    src = model_folder(vit(), tokenizer=False, data=False)
    with pytest.raises(BlockforgeError, match="normalized"):
        export_run(src, tmp_path / "timm", format="timm")
    assert not (tmp_path / "timm").exists() or not any((tmp_path / "timm").iterdir())


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
    (vit(parametrization="mup", base_width=24), "logits scaled by 0.5 (muP)"),
    (vit(parametrization="mup", base_width=12, attention_scale="inverse"), "attention scores scaled by 0.5 beyond 1/sqrt(head_dim) (muP)"),
    (vit(parametrization="completep", base_depth=1), "branches scaled by 0.5 (CompleteP or a residual multiplier)"),
])
def test_any_other_vit_is_refused_in_one_sentence(model_folder, tmp_path, capsys, spec, needle):
    src = model_folder(spec, tokenizer=False)
    assert main(["export", str(src), "--out", str(tmp_path / "timm"), "--format", "timm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "timm's VisionTransformer cannot hold this vit" in err and needle in err and "blockforge.load" in err
    assert not (tmp_path / "timm").exists()


def test_a_llama_is_refused_for_timm(model_folder, tmp_path):
    llama = tiny_llama(depth=2, context=16)
    with pytest.raises(BlockforgeError, match="--format timm exports vit models, and this is a llama model"):
        export_run(model_folder(llama), tmp_path / "timm", format="timm")

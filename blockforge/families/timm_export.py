"""`--format timm`: a uniform Pre-LN vit as timm `VisionTransformer` weights (model.safetensors + config.json + card).

config.json is in timm's hub layout (architecture, model_args, pretrained_cfg), so the folder loads with
`timm.create_model("local-dir:FOLDER", pretrained=True)`, or by name with the weights file given in
`pretrained_cfg_overlay`. Every tensor is renamed to timm's (families/vit_timm.timm_names) or the export
is refused by name; the staged folder is loaded back with timm, strictly, and refused unless its logits
equal blockforge's within 1e-4. A vit timm's VisionTransformer cannot hold (another placement, Mix-LN,
per-layer heads or ffn, RMSNorm, another eps) is refused before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from blockforge.io import read_json
from blockforge.families.conversion import ConversionError, TensorSource, check_same_outputs, rounded_to
from blockforge.families.formats import ExportFormat, copy_records, front_matter, publish, staging
from blockforge.families.vit_timm import timm_names
from blockforge.spec.fields import plain_problems
from blockforge.spec.model import ResolvedSpec

ARCHITECTURE = "vit_base_patch16_224"  # a plain registered ViT; model_args override every size it names
TIMM_EPS = 1e-6  # the LayerNorm eps of timm's VisionTransformer
CAUSE = "so the timm folder would not compute what blockforge.load computes"


def spec_problems(spec: ResolvedSpec) -> list[str]:
    placements = sorted({layer.placement_name for layer in spec.layers})
    differ, extra = plain_problems(spec, presence=("layer_scale",))  # the gains themselves are weights
    layer = spec.layers[0]
    problems = {
        f"placements {', '.join(placements)} (timm has Pre-LN blocks only)": placements != ["pre"],
        f"{', '.join(differ)} that differ between layers": bool(differ),
        ", ".join(extra): bool(extra),
        f"{layer.norm} norms": spec.norm != "layernorm" or layer.norm != "layernorm",
        f"norm eps {spec.norm_eps:g} (timm uses {TIMM_EPS:g})": spec.norm_eps != TIMM_EPS,
        "grouped-query attention or a head_dim of its own": layer.kv_heads != layer.heads or layer.head_dim * layer.heads != spec.width,
        "an MLP bias setting unlike the attention output's (timm's proj_bias sets both)": spec.proj_bias != spec.mlp_bias,
        f"branches scaled by {spec.branch_multiplier:.4g} (CompleteP or a residual multiplier)": spec.branch_multiplier != 1.0,
        f"RMSNorm gains {spec.norm_weight_offset:g} + w": spec.norm_weight_offset != 0.0,
        f"an MLP activation {layer.mlp_act} (timm's is the exact GELU)": layer.mlp_act not in (None, "gelu"),
        f"logits scaled by {spec.readout_multiplier:.4g} (muP)": spec.readout_multiplier != 1.0,
        f"attention scores scaled by {spec.attention_multiplier(layer):.4g} beyond 1/sqrt(head_dim) (muP)": spec.attention_multiplier(layer) != 1.0,
    }
    return [problem for problem, present in problems.items() if present]


def check(spec: ResolvedSpec) -> None:
    problems = spec_problems(spec)
    if problems:
        raise ConversionError(
            f"--format timm: timm's VisionTransformer cannot hold this vit ({'; '.join(problems)}); "
            "export it with --format blockforge, which blockforge.load reads"
        )


def model_args(spec: ResolvedSpec) -> dict:
    """timm.create_model keyword arguments that build the same architecture."""
    width, ffn = spec.width, spec.layers[0].ffn
    return {
        "img_size": spec.image_size, "patch_size": spec.patch_size, "in_chans": spec.channels, "num_classes": spec.classes,
        "embed_dim": width, "depth": spec.depth, "num_heads": spec.layers[0].heads, "mlp_ratio": mlp_ratio(width, ffn),
        "final_norm": spec.final_norm, "qkv_bias": spec.qkv_bias, "proj_bias": spec.proj_bias, "qk_norm": spec.layers[0].qk_norm,
        # timm builds LayerScale only with init_values; the loaded gammas replace this value.
        **({"init_values": 1.0} if spec.layers[0].layer_scale is not None else {}),
    }


def mlp_ratio(width: int, ffn: int) -> float:
    """A ratio for which timm's int(width * ratio) is exactly `ffn`."""
    ratio = ffn / width
    if int(width * ratio) != ffn:
        ratio = float(torch.nextafter(torch.tensor(ratio, dtype=torch.float64), torch.tensor(float("inf"), dtype=torch.float64)))
    if int(width * ratio) != ffn:
        raise ConversionError(f"--format timm: no mlp_ratio gives timm an MLP of {ffn} for width {width}; export with --format blockforge")
    return ratio


def preprocessing(native_dir: Path, spec: ResolvedSpec) -> dict:
    """How the model's training and evaluation images were made (mean, std, interpolation, crop_pct): from the run's
    data.json, or, for a run written before it recorded them, from its recipe's data rebuilt."""
    data = read_json(native_dir / "data.json", "export the run again") if (native_dir / "data.json").exists() else {}
    found = data.get("preprocess") if isinstance(data, dict) else None
    if found is None and (native_dir / "recipe.yaml").exists():
        from blockforge.data import dataset_for
        from blockforge.spec.recipe import read_yaml, recipe_from_data

        recipe = recipe_from_data(read_yaml(native_dir / "recipe.yaml"), file=str(native_dir / "recipe.yaml"))
        found = dataset_for(recipe).describe().get("preprocess")
    if not isinstance(found, dict) or len(found.get("mean", ())) != spec.channels or len(found.get("std", ())) != spec.channels:
        raise ConversionError("--format timm writes how the model's images are normalized, and this run records it for "
                              f"{spec.channels} channels neither in data.json nor through its recipe.yaml; export it with --format blockforge")
    return found


def config(spec: ResolvedSpec, preprocess: dict) -> dict:
    """config.json in timm's hub layout; its pretrained_cfg says how inputs are prepared (timm.data.resolve_data_config)."""
    return {
        "architecture": ARCHITECTURE,
        "num_classes": spec.classes,
        "num_features": spec.width,
        "global_pool": "token",
        "model_args": model_args(spec),
        "pretrained_cfg": {
            "input_size": [spec.channels, spec.image_size, spec.image_size],
            "fixed_input_size": True,
            "mean": list(preprocess["mean"]),
            "std": list(preprocess["std"]),
            "interpolation": preprocess["interpolation"],
            "crop_pct": preprocess["crop_pct"],
            "crop_mode": "center",
            "num_classes": spec.classes,
            "first_conv": "patch_embed.proj",
            "classifier": "head",
        },
        "blockforge_arch_hash": spec.arch_hash(),
    }


def write(model: nn.Module, native_dir: Path, out_dir: Path, card: str, dtype: torch.dtype | None = None) -> None:
    """The timm folder of `model` (loaded from the native export `native_dir`) in `out_dir`, its weights at `dtype`
    (default float32)."""
    spec: ResolvedSpec = model.spec
    dtype = dtype or torch.float32
    tensors = {name: tensor.to(dtype) for name, tensor in timm_tensors(model).items()}
    preprocess = preprocessing(native_dir, spec)
    with staging(out_dir) as stage:
        save_file(tensors, str(stage / "model.safetensors"), metadata={"format": "pt"})
        (stage / "config.json").write_text(json.dumps(config(spec, preprocess), indent=2) + "\n")
        copy_records(native_dir, stage)
        (stage / "README.md").write_text(front_matter(library_name="timm", pipeline_tag="image-classification", tags=["blockforge"]) + card)
        verify(stage, model, dtype)
        publish(stage, out_dir)


def timm_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of `model` under timm's name, each taken exactly once (else refused by name)."""
    spec: ResolvedSpec = model.spec
    source = TensorSource(model, "this blockforge vit", into="timm's VisionTransformer")
    tensors = {}
    for ours, theirs in timm_names(spec).items():
        tensors[theirs] = source.take(ours).detach().to("cpu", torch.float32).contiguous()
    source.finish()
    return tensors


def overlay(spec: ResolvedSpec, preprocess: dict, file: str) -> dict:
    """The by-name call's pretrained_cfg_overlay: the weights file, the classes (else timm drops the head) and how inputs
    are prepared (else timm takes the registered architecture's mean, std, interpolation and crop)."""
    return {"file": file, "num_classes": spec.classes, "input_size": (spec.channels, spec.image_size, spec.image_size),
            "mean": tuple(preprocess["mean"]), "std": tuple(preprocess["std"]), "interpolation": preprocess["interpolation"],
            "crop_pct": preprocess["crop_pct"], "crop_mode": "center"}


def create_by_name(stage: Path, spec: ResolvedSpec) -> nn.Module:
    """The documented by-name call, with the overlay config.json's pretrained_cfg gives."""
    import timm

    pretrained = json.loads((stage / "config.json").read_text())["pretrained_cfg"]
    return timm.create_model(ARCHITECTURE, pretrained=True, pretrained_cfg_overlay=overlay(spec, pretrained, str(stage / "model.safetensors")),
                             **model_args(spec))


def verify(stage: Path, model: nn.Module, dtype: torch.dtype = torch.float32) -> None:
    """Both documented ways of loading the staged folder load every tensor (strictly), prepare inputs as training did
    and give blockforge's logits (on the weights as written)."""
    import timm

    spec: ResolvedSpec = model.spec
    images = torch.randn(2, spec.channels, spec.image_size, spec.image_size, generator=torch.Generator().manual_seed(0))
    data_configs = []
    with torch.no_grad():
        expected = rounded_to(model, dtype)(images)
        for load in (lambda: create_by_name(stage, spec), lambda: timm.create_model(f"local-dir:{stage}", pretrained=True)):
            try:
                loaded = load()
            except RuntimeError as err:  # timm's strict load: missing or unexpected keys, other shapes
                raise ConversionError(f"timm does not load the written folder ({str(err).splitlines()[0]}); refused") from None
            strict_reload(loaded, stage)
            check_same_outputs(loaded.eval().float()(images), expected, "the written timm folder", cause=CAUSE)
            resolved = timm.data.resolve_data_config({}, model=loaded)
            data_configs.append({key: tuple(value) if isinstance(value, list) else value for key, value in resolved.items()})
    if data_configs[0] != data_configs[1]:
        raise ConversionError(f"timm prepares inputs differently by name ({data_configs[0]}) and from the folder ({data_configs[1]}); refused")


def strict_reload(loaded: nn.Module, stage: Path) -> None:
    """Refuse unless the weights file and the timm model hold exactly the same tensor names and shapes."""
    from safetensors.torch import load_file

    saved = load_file(str(stage / "model.safetensors"))
    held = loaded.state_dict()
    missing, unexpected = sorted(set(held) - set(saved)), sorted(set(saved) - set(held))
    misshapen = sorted(name for name in set(held) & set(saved) if held[name].shape != saved[name].shape)
    if missing or unexpected or misshapen:
        raise ConversionError(f"the written timm folder does not match timm's model (missing {missing[:3]}, unexpected {unexpected[:3]}, "
                              f"other shapes {misshapen[:3]}); refused")
    if not all(torch.equal(held[name].cpu().to(saved[name].dtype), saved[name]) for name in saved):
        raise ConversionError("timm changed tensors while loading the written folder; refused")


def usage(spec: ResolvedSpec, native_dir: Path) -> str:
    args = ", ".join(f"{key}={value!r}" for key, value in model_args(spec).items())
    given = {key: value for key, value in overlay(spec, preprocessing(native_dir, spec), "FILE").items() if key != "file"}
    settings = ", ".join(f"{key}={value!r}" for key, value in given.items())
    return f"""This folder is timm `VisionTransformer` weights (config.json in timm's hub layout); its logits equal `blockforge.load`'s.
config.json's pretrained_cfg holds the input size, mean and std training used, so timm prepares images the same way.

```python
import timm

model = timm.create_model("local-dir:path/to/this/folder", pretrained=True)
transform = timm.data.create_transform(**timm.data.resolve_data_config({{}}, model=model))  # PIL image -> input tensor
# or by name, every size given, and in the overlay the classes (else timm drops the head) and the preprocessing
# (else timm takes {ARCHITECTURE}'s own mean, std, interpolation and crop):
model = timm.create_model("{ARCHITECTURE}", pretrained=True,
                          pretrained_cfg_overlay=dict(file="path/to/this/folder/model.safetensors", {settings}),
                          {args})
```
"""


TIMM_FORMAT = ExportFormat(name="timm", library="timm", check=check, usage=usage, write=write)

"""Malformed recipes: `blockforge inspect` exits 2 with one line naming the file and the key path."""

import subprocess
import sys

import pytest

from blockforge.cli import main

GOOD_MODEL = """\
model:
  family: llama
  width: 64
  depth: 4
  heads: 4
  ffn: 128
  vocab: 100
  context: 32
"""

# (name, recipe text, text the error line must contain). The file name is checked for every case.
CASES = [
    ("unknown top-level key", GOOD_MODEL + "trian: {steps: 3}\n", "trian"),
    ("unknown model key", GOOD_MODEL + "  dpeth: 3\n", "model.dpeth"),
    ("unknown placement", GOOD_MODEL + "  layers: {default: {placement: pst}}\n", "model.layers.default.placement"),
    ("alpha above 1", GOOD_MODEL + "  layers: {mix_ln: {alpha: 1.5}}\n", "model.layers.mix_ln.alpha"),
    ("alpha below 0", GOOD_MODEL + "  layers: {mix_ln: {alpha: -0.1}}\n", "model.layers.mix_ln.alpha"),
    ("alpha missing", GOOD_MODEL + "  layers: {mix_ln: {early: post}}\n", "model.layers.mix_ln.alpha"),
    ("heads not dividing width", GOOD_MODEL.replace("heads: 4", "heads: 5"), "model.heads"),
    ("override heads not dividing width", GOOD_MODEL + "  layers: {overrides: [{at: 1, heads: 7}]}\n", "model.layers.overrides[0].heads"),
    ("odd rotary head dim", GOOD_MODEL.replace("heads: 4", "heads: 64"), "model.heads"),
    ("slice selecting nothing", GOOD_MODEL + "  layers: {overrides: [{at: '8:', placement: post}]}\n", "model.layers.overrides[0].at"),
    ("index out of range", GOOD_MODEL + "  layers: {overrides: [{at: [0, 4], placement: post}]}\n", "model.layers.overrides[0].at[1]"),
    ("at that is not an index", GOOD_MODEL + "  layers: {overrides: [{at: first, placement: post}]}\n", "model.layers.overrides[0].at"),
    ("override setting nothing", GOOD_MODEL + "  layers: {overrides: [{at: 1}]}\n", "model.layers.overrides[0]"),
    ("overrides not a list", GOOD_MODEL + "  layers: {overrides: {at: 1, ffn: 3}}\n", "model.layers.overrides"),
    ("width of wrong type", GOOD_MODEL.replace("width: 64", "width: wide"), "model.width"),
    ("depth given as boolean", GOOD_MODEL.replace("depth: 4", "depth: true"), "model.depth"),
    ("family missing", GOOD_MODEL.replace("  family: llama\n", ""), "model.family"),
    ("unknown family", GOOD_MODEL.replace("family: llama", "family: gpt"), "model.family"),
    ("odd head_dim beside heads", GOOD_MODEL + "  head_dim: 15\n", "model.head_dim"),
    ("neither heads nor head_dim", GOOD_MODEL.replace("  heads: 4\n", ""), "model.heads"),
    ("no ffn", GOOD_MODEL.replace("  ffn: 128\n", ""), "model.ffn"),
    ("vit key on llama", GOOD_MODEL + "  classes: 10\n", "model.classes"),
    ("negative lr", GOOD_MODEL + "train: {lr: -1.0}\n", "train.lr"),
    ("unknown optimizer", GOOD_MODEL + "train: {optimizer: sgdd}\n", "train.optimizer"),
    ("batch not a multiple of micro batch", GOOD_MODEL + "train: {batch_size: 10, micro_batch_size: 4}\n", "train.micro_batch_size"),
    ("unknown data source", GOOD_MODEL + "data: {source: c4}\n", "data.source"),
    ("image source for llama", GOOD_MODEL + "data: {source: digits}\n", "data.source"),
    ("text source without path", GOOD_MODEL + "data: {source: text}\n", "data.path"),
    ("model is a list", "model: [1, 2]\n", "model"),
    ("recipe is a scalar", "42\n", "mapping"),
    ("no model section", "train: {steps: 3}\n", "model"),
    ("YAML syntax error", GOOD_MODEL + "  layers: {default: [placement: pre\n", "line"),
    ("base file missing", "base: nowhere.yaml\n" + GOOD_MODEL, "base"),
    ("bad tab indentation", GOOD_MODEL + "\tdepth: 3\n", "YAML"),
]

GOOD_VIT = """\
model:
  family: vit
  width: 32
  depth: 2
  heads: 2
  ffn: 64
  image_size: 8
  patch_size: 4
  classes: 10
"""
LAYERS = GOOD_MODEL + "  layers: "
# The per-layer knobs (kv_heads, head_dim, window, norm, qk/v norm, layer scale, sub-layer placements) and the
# model-level ones that go with them.
CASES += [
    ("kv_heads not dividing heads", LAYERS + "{default: {kv_heads: 3}}\n", "model.layers.default.kv_heads"),
    ("model kv_heads not dividing heads", GOOD_MODEL + "  kv_heads: 3\n", "model.kv_heads"),
    ("kv_heads zero", LAYERS + "{overrides: [{at: 0, kv_heads: 0}]}\n", "model.layers.overrides[0].kv_heads"),
    ("odd head_dim in one layer", LAYERS + "{overrides: [{at: 1, head_dim: 7}]}\n", "model.layers.overrides[0].head_dim"),
    ("window of zero", LAYERS + "{default: {window: 0}}\n", "model.layers.default.window"),
    ("negative window", LAYERS + "{overrides: [{at: 2, window: -4}]}\n", "model.layers.overrides[0].window"),
    ("window as text", LAYERS + "{default: {window: wide}}\n", "model.layers.default.window"),
    ("window on a vit", GOOD_VIT + "  layers: {default: {window: 4}}\ndata: {source: digits}\n", "model.layers.default.window"),
    ("linear rope scaling on a vit", GOOD_VIT + "  layers: {overrides: [{at: 0, rope_linear_factor: 8.0}]}\ndata: {source: digits}\n",
     "model.layers.overrides[0].rope_linear_factor"),
    ("unknown norm type", LAYERS + "{default: {norm: batchnorm}}\n", "model.layers.default.norm"),
    ("unknown model norm", GOOD_MODEL + "  norm: groupnorm\n", "model.norm"),
    ("qk_norm not a boolean", LAYERS + "{default: {qk_norm: 3}}\n", "model.layers.default.qk_norm"),
    ("negative layer scale", LAYERS + "{default: {layer_scale: -0.1}}\n", "model.layers.default.layer_scale"),
    ("sub-layer placement without mlp", LAYERS + "{default: {placement: {attn: pre}}}\n", "model.layers.default.placement.mlp"),
    ("unknown sub-layer placement", LAYERS + "{default: {placement: {attn: none, mlp: pst}}}\n", "model.layers.default.placement.mlp"),
    ("extra sub-layer key", LAYERS + "{default: {placement: {attn: pre, mlp: post, out: pre}}}\n", "model.layers.default.placement.out"),
    ("Mix-LN early settings empty", LAYERS + "{mix_ln: {alpha: 0.5, early: {}}}\n", "model.layers.mix_ln.early"),
    ("Mix-LN early unknown key", LAYERS + "{mix_ln: {alpha: 0.5, early: {placment: post}}}\n", "model.layers.mix_ln.early.placment"),
    ("unknown rope scaling", GOOD_MODEL + "  rope_scaling: {type: yarn}\n", "model.rope_scaling.type"),
    ("rope scaling bounds crossed", GOOD_MODEL + "  rope_scaling: {type: llama3, low_freq_factor: 4, high_freq_factor: 1}\n", "model.rope_scaling.high_freq_factor"),
    ("DyT alpha zero", GOOD_MODEL + "  dyt_alpha: 0\n", "model.dyt_alpha"),
    ("bias flag as text", GOOD_MODEL + "  qkv_bias: sometimes\n", "model.qkv_bias"),
]
# Layer rules (ramp, pattern) and the CompleteP parametrization.
CASES += [
    ("ramp with MIN above MAX", LAYERS + "{ramp: {ffn: [4.0, 0.5]}}\n", "model.layers.ramp.ffn"),
    ("ramp with one number", LAYERS + "{ramp: {heads: [0.5]}}\n", "model.layers.ramp.heads"),
    ("ramp with a zero multiplier", LAYERS + "{ramp: {ffn: [0.0, 1.0]}}\n", "model.layers.ramp.ffn"),
    ("ramp of nothing", LAYERS + "{ramp: {}}\n", "model.layers.ramp"),
    ("ramp of an unknown field", LAYERS + "{ramp: {width: [1, 2]}}\n", "model.layers.ramp.width"),
    ("pattern every 0", LAYERS + "{pattern: [{every: 0, set: {window: 8}}]}\n", "model.layers.pattern[0].every"),
    ("pattern offset outside its period", LAYERS + "{pattern: [{every: 2, offset: 2, set: {window: 8}}]}\n", "model.layers.pattern[0].offset"),
    ("pattern selecting no layer", LAYERS + "{pattern: [{every: 6, offset: 5, set: {window: 8}}]}\n", "model.layers.pattern[0].offset"),
    ("pattern setting nothing", LAYERS + "{pattern: [{every: 2, set: {}}]}\n", "model.layers.pattern[0].set"),
    ("pattern without set", LAYERS + "{pattern: [{every: 2}]}\n", "model.layers.pattern[0].set"),
    ("completep without base depth", GOOD_MODEL + "  parametrization: completep\n", "model.base_depth"),
    ("depth alpha outside [0.5, 1]", GOOD_MODEL + "  parametrization: completep\n  base_depth: 2\n  depth_alpha: 0.3\n", "model.depth_alpha"),
    ("unknown parametrization", GOOD_MODEL + "  parametrization: umup\n", "model.parametrization"),
    ("mup without base width", GOOD_MODEL + "  parametrization: mup\n", "model.base_width"),
    ("base width zero", GOOD_MODEL + "  parametrization: mup\n  base_width: 0\n", "model.base_width"),
    ("inverse attention scale without a base width", GOOD_MODEL + "  attention_scale: inverse\n", "model.attention_scale"),
    ("unknown attention scale", GOOD_MODEL + "  attention_scale: cubic\n", "model.attention_scale"),
    ("a path the built-in corpus does not read", GOOD_MODEL + "data: {source: builtin, path: c4.txt}\n", "data.path: is not read for data.source builtin"),
    ("a Hub dataset with text files", GOOD_MODEL + "data: {source: text, path: a.txt, dataset: allenai/c4}\n", "data.dataset: is not read"),
]


@pytest.mark.parametrize("name,text,needle", CASES, ids=[c[0] for c in CASES])
def test_bad_recipe_is_one_line_exit_2(tmp_path, capsys, name, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code = main(["inspect", str(path)])
    out, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(path) in lines[0]
    assert needle in lines[0]
    assert "Traceback" not in err and out == ""


def test_missing_file(capsys):
    assert main(["inspect", "does/not/exist.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "does/not/exist.yaml" in err and "not found" in err


def test_base_cycle(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n" + GOOD_MODEL)
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    assert main(["inspect", str(tmp_path / "a.yaml")]) == 2
    assert "cycle" in capsys.readouterr().err


@pytest.mark.parametrize("assignment,needle", [("model.dpeth=3", "model.dpeth"), ("model.depth", "KEY=VALUE"), ("model.width.x=3", "model.width.x"), ("model.depth=deep", "model.depth")])
def test_bad_set_flag(tmp_path, capsys, assignment, needle):
    path = tmp_path / "good.yaml"
    path.write_text(GOOD_MODEL)
    assert main(["inspect", str(path), "--set", assignment]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err


def test_a_bad_value_says_whether_a_set_gave_it(tmp_path, capsys):
    """The file named does not hold a value --set gave: the sentence says which --set did; a file's own value, not."""
    path = tmp_path / "good.yaml"
    path.write_text(GOOD_MODEL)
    assert main(["inspect", str(path), "--set", "model.depth=deep", "--set", "model.width=64"]) == 2
    assert "model.depth (from --set model.depth=deep): must be an integer" in capsys.readouterr().err
    assert main(["inspect", str(path), "--set", "model.layers={mix_ln: {alpha: 3}}"]) == 2
    assert 'model.layers.mix_ln.alpha (from --set model.layers={"mix_ln": {"alpha": 3}}): must lie in [0, 1]' in capsys.readouterr().err
    assert main(["inspect", str(path), "--set", "train.betas=0.9"]) == 2
    assert "train.betas (from --set train.betas=0.9): must be a list of numbers, not 0.9 (float)" in capsys.readouterr().err
    path.write_text(GOOD_MODEL.replace("heads: 4", "heads: 5"))
    assert main(["inspect", str(path), "--set", "model.depth=2"]) == 2
    assert "from --set" not in capsys.readouterr().err


def test_real_process_prints_no_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD_MODEL.replace("heads: 4", "heads: 5"))
    done = subprocess.run([sys.executable, "-m", "blockforge", "inspect", str(path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"{path}: model.heads: 5 heads do not divide width 64" in done.stderr


def test_unknown_flag_is_one_line():
    done = subprocess.run([sys.executable, "-m", "blockforge", "inspect", "x.yaml", "--frobnicate"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--frobnicate" in done.stderr

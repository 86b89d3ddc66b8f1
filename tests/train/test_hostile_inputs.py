"""Hostile inputs: bad recipes and flags, damaged run and export folders. Each is one sentence and exit
status 2 (or the fallback the run announces), never a traceback, and quick.

Damaged folders are copies of one tiny run (and its export) trained once for the module.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

import blockforge
from blockforge.cli import main
from blockforge.errors import CorruptFolderError
from blockforge.export import export_run
from blockforge.spec import load_recipe
from blockforge.train.loop import train
from tiny_data import tiny_recipe, write_recipe


@pytest.fixture(autouse=True)
def _one_thread():
    """Cases time themselves: one torch thread keeps them quick on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 10-step run (checkpoints at steps 5 and 10) and its export, never changed: cases damage copies."""
    folder = tmp_path_factory.mktemp("hostile")
    recipe = write_recipe(folder, steps=10, checkpoint_every=5, eval_every=5, log_every=5, grad_norm_every=0)
    train(load_recipe(recipe), folder / "run", progress=False)
    export_run(folder / "run", folder / "export")
    return folder


@dataclass
class Case:
    tmp: Path
    source: Path

    def __post_init__(self):
        self.recipe = self.tmp / "tiny.yaml"
        shutil.copyfile(self.source / "tiny.yaml", self.recipe)
        self.run = self.tmp / "run"
        self.export = self.tmp / "export"
        shutil.copytree(self.source / "run", self.run)
        shutil.copytree(self.source / "export", self.export)
        self.newest = self.run / "checkpoints" / "step-00000010"
        self.older = self.run / "checkpoints" / "step-00000005"

    def write(self, name: str, text: str) -> Path:
        path = self.tmp / name
        path.write_text(text)
        return path

    def recipe_text(self, **model) -> str:
        data = tiny_recipe(self.tmp)
        data["model"].update(model)
        return yaml.safe_dump(data, sort_keys=False)


# ---- ways to damage a file ---------------------------------------------------------------------


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def rewrite_header(path: Path, change) -> None:
    """Apply `change(header dict)` and write the file back with the same tensor bytes."""
    head, body = header(path)
    change(head)
    text = json.dumps(head).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


def lie_about_dtype(head: dict) -> None:
    head["embed.weight"]["dtype"] = "I32"  # as many bytes as F32: the file still parses


def shrink_dtype(head: dict) -> None:
    head["embed.weight"]["dtype"] = "F16"  # half the bytes the offsets say


def swap_offsets(head: dict) -> None:
    a, b = "layers.0.attn_norm.weight", "layers.1.attn_norm.weight"
    if a not in head:  # names of the two first norms, whatever the placement calls them
        norms = sorted(k for k, v in head.items() if k.startswith("layers.") and k.endswith("norm.weight"))
        a, b = norms[0], norms[-1]
    head[a]["data_offsets"], head[b]["data_offsets"] = head[b]["data_offsets"], head[a]["data_offsets"]


def flip_bytes(path: Path) -> None:
    head, body = header(path)
    raw = bytearray(path.read_bytes())
    middle = len(raw) - len(body) // 2
    raw[middle : middle + 16] = bytes(255 - b for b in raw[middle : middle + 16])
    path.write_bytes(bytes(raw))


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (old, text)
    path.write_text(text.replace(old, new, 1))


def to_vit(case: Case, sizes: str) -> None:
    """The run's spec.yaml turned into a vit one."""
    edit(case.run / "spec.yaml", "family: llama", "family: vit")
    edit(case.run / "spec.yaml", "vocab: 300\ncontext: 32\n", sizes)


def set_latest(case: Case, text: str) -> None:
    (case.run / "checkpoints" / "latest.json").write_text(text)


# ---- the corpus: (name, set-up returning argv, exit status, text the error must hold) ----------

RECIPES = [
    ("duplicate top-level key", lambda c: ["inspect", str(c.write("r.yaml", c.recipe_text() + "model: {family: vit}\n"))], 2,
     "'model' is given twice"),
    ("duplicate nested key", lambda c: ["inspect", str(c.write("r.yaml", c.recipe_text().replace("  depth: 2\n", "  depth: 2\n  depth: 3\n")))], 2,
     "model.depth: line"),
    ("duplicate key in a flow mapping", lambda c: ["inspect", str(c.write("r.yaml", c.recipe_text(layers={"mix_ln": {"alpha": 0.5}}).replace(
        "alpha: 0.5", "alpha: 0.5\n      early: post\n      early: pre")))], 2, "model.layers.mix_ln.early"),
    ("base-60 at", lambda c: ["inspect", str(c.write("r.yaml", c.recipe_text().replace(
        "  layers:\n", "  layers:\n    overrides:\n    - at: 1:3\n      placement: post\n")))], 2, "model.layers.overrides[0].at: line"),
    ("base-60 at in a flow list", lambda c: ["inspect", str(c.write("r.yaml", c.recipe_text().replace(
        "  layers:\n", "  layers:\n    overrides: [{at: 2:4, placement: post}]\n")))], 2, "quote it: at: '2:4'"),
    ("base-60 steps", lambda c: ["inspect", str(c.write("r.yaml", c.recipe_text().replace("steps: 30", "steps: 1:30")))], 2, "train.steps"),
    ("alias that refers to itself", lambda c: ["inspect", str(c.write("r.yaml", c.recipe_text() + "extra: &a [1, *a]\n"))], 2,
     "refers to itself"),
    ("alias bomb", lambda c: ["inspect", str(c.write("r.yaml", "a: &a [" + ",".join(["x"] * 10) + "]\n" + "".join(
        f"{n}: &{n} [" + ",".join([f"*{p}"] * 10) + "]\n" for p, n in zip("abcdef", "bcdefg"))))], 2, "anchors and aliases"),
    ("nested too deeply", lambda c: ["inspect", str(c.write("r.yaml", "model: " + "[" * 3000 + "]" * 3000 + "\n"))], 2, "r.yaml"),
    ("random bytes as a recipe", lambda c: (c.tmp / "r.yaml").write_bytes(os.urandom(300)) and ["inspect", str(c.tmp / "r.yaml")], 2, "r.yaml"),
    ("model is a list, --set into it", lambda c: ["inspect", str(c.write("r.yaml", "model: [1, 2]\n")), "--set", "model.width=64"], 2,
     "model: is a list"),
    ("train is a number, --set into it", lambda c: ["inspect", str(c.write("r.yaml", c.recipe_text().split("train:")[0] + "train: 5\n")),
                                                    "--set", "train.steps=3"], 2, "single value 5"),
    ("--set with a duplicate key", lambda c: ["inspect", str(c.recipe), "--set", "data.tokenizer={bpe: 300, bpe: 200}"], 2,
     "given twice"),
    ("--set base-60 width", lambda c: ["inspect", str(c.recipe), "--set", "model.width=1:3"], 2, "model.width (from --set model.width=1:3): must be an integer"),
    ("--set without a value", lambda c: ["inspect", str(c.recipe), "--set", "model.depth"], 2, "KEY=VALUE"),
    ("--set of an unknown key", lambda c: ["train", str(c.recipe), "--out", str(c.tmp / "new"), "--set", "train.stepz=3"], 2, "train.stepz"),
    ("--set negative steps", lambda c: ["train", str(c.recipe), "--out", str(c.tmp / "new"), "--set", "train.steps=-1"], 2, "train.steps"),
    ("search file with a duplicate key", lambda c: ["search", str(c.write("s.yaml", "name: a\nrecipe: tiny.yaml\nname: b\n"))], 2,
     "s.yaml: name: line 3: 'name' is given twice"),
    ("search file's recipe with a base-60 value", lambda c: c.write("r.yaml", c.recipe_text().replace("steps: 30", "steps: 2:30")) and
     ["search", str(c.write("s.yaml", "name: a\nbase: r.yaml\n"))], 2, "r.yaml: train.steps"),
    ("--set key with an empty last part", lambda c: ["inspect", str(c.recipe), "--set", "model.width.=64"], 2, "it has an empty part"),
    ("--set key with an empty middle part", lambda c: ["train", str(c.recipe), "--out", str(c.tmp / "new"), "--set", "model..width=64"], 2,
     "model..width: is not a dotted key"),
    ("at: '-0'", lambda c: ["inspect", str(c.recipe), "--set", "model.layers.overrides=[{at: '-0', placement: post}]"], 2,
     """model.layers.overrides[0].at (from --set model.layers.overrides=[{"at": "-0", "placement": "post"}]): '-0' holds -0"""),
    ("at: a layer twice", lambda c: ["inspect", str(c.write("r.yaml", c.recipe_text(layers={"overrides": [{"at": [1, -1], "placement": "post"}]})))],
     2, "model.layers.overrides[0].at[1]: names layer 1 twice (as 1 and -1)"),
    ("train a model larger than the machine", lambda c: ["train", str(c.recipe), "--out", str(c.tmp / "new"), "--set", "model.width=100000000"],
     2, "GiB available on this machine; make the model or train.micro_batch_size smaller"),
    ("train a ramp that multiplies widths by a million", lambda c: ["train", str(c.write("r.yaml", c.recipe_text(
        layers={"ramp": {"ffn": [1.0e6, 2.0e6]}}))), "--out", str(c.tmp / "new")], 2, "GiB available on this machine"),
    ("generate --temperature nan", lambda c: ["generate", str(c.run), "--prompt", "x", "--temperature", "nan"], 2, "--temperature must be a finite number"),
    ("generate --temperature inf", lambda c: ["generate", str(c.export), "--prompt", "x", "--temperature", "inf"], 2, "--temperature must be a finite number"),
    ("generate --top-p nan", lambda c: ["generate", str(c.run), "--prompt", "x", "--top-p", "nan"], 2, "--top-p must lie in (0, 1]"),
    ("generate --top-k 0", lambda c: ["generate", str(c.export), "--prompt", "x", "--top-k", "0"], 2, "--top-k must be at least 1"),
    ("generate --seed 2**64", lambda c: ["generate", str(c.run), "--prompt", "x", "--seed", str(2**64)], 2,
     "--seed must be a whole number from 0 to 2**64 - 1 (18446744073709551615), not 18446744073709551616"),
    ("generate --seed -1", lambda c: ["generate", str(c.export), "--prompt", "x", "--seed", "-1"], 2, "--seed must be a whole number from 0"),
    ("eval --batches -3", lambda c: ["eval", str(c.run), "--batches", "-3"], 2, "--batches"),
    ("eval --batches 0", lambda c: ["eval", str(c.run), "--batches", "0"], 2, "--batches"),
]

RUNS = [
    ("truncated weights", lambda c: truncate(c.newest / "model.safetensors") or ["eval", str(c.run)], 2, "not a readable safetensors file"),
    ("empty weights", lambda c: truncate(c.newest / "model.safetensors", 0) or ["eval", str(c.run)], 2, "header too small"),
    ("random bytes as weights", lambda c: (c.newest / "model.safetensors").write_bytes(os.urandom(4096)) and ["eval", str(c.run)], 2,
     "model.safetensors: is not a readable"),
    ("header dtype that lies, same size", lambda c: rewrite_header(c.newest / "model.safetensors", lie_about_dtype) or ["eval", str(c.run)], 2,
     "holds embed.weight as I32, but spec.yaml builds F32"),
    ("header dtype that lies about the size", lambda c: rewrite_header(c.newest / "model.safetensors", shrink_dtype) or ["eval", str(c.run)], 2,
     "invalid shape, data type, or offset"),
    ("header offsets swapped", lambda c: rewrite_header(c.newest / "model.safetensors", swap_offsets) or ["eval", str(c.run)], 2,
     "differ from the checksum"),
    ("overwritten weight bytes", lambda c: flip_bytes(c.newest / "model.safetensors") or ["export", str(c.run), "--out", str(c.tmp / "x")], 2,
     "differ from the checksum"),
    ("weights missing", lambda c: (c.newest / "model.safetensors").unlink() or ["analyze", str(c.run), "--grad-norms", "--out", str(c.tmp / "a")],
     2, "model.safetensors: is missing"),
    ("latest.json cut off", lambda c: set_latest(c, '{"step": 10, "pa') or ["eval", str(c.run)], 2, "latest.json: is not valid JSON"),
    ("latest.json empty", lambda c: set_latest(c, "") or ["export", str(c.run), "--out", str(c.tmp / "x")], 2, "it is empty"),
    ("latest.json pointing up and out", lambda c: set_latest(c, '{"step": 10, "path": "../../export"}') or ["eval", str(c.run)], 2,
     "not a step-NNNNNNNN folder inside"),
    ("latest.json with an absolute path", lambda c: set_latest(c, json.dumps({"step": 10, "path": str(c.export)})) or ["eval", str(c.run)], 2,
     "not a step-NNNNNNNN folder inside"),
    ("latest.json outside, on resume", lambda c: set_latest(c, '{"step": 10, "path": "../step-00000010"}') or
     ["train", str(c.recipe), "--out", str(c.run), "--resume", "--no-progress"], 2, "not a step-NNNNNNNN folder inside"),
    ("latest.json naming a missing folder", lambda c: set_latest(c, '{"step": 20, "path": "step-00000020"}') or ["eval", str(c.run)], 2,
     "does not exist"),
    ("latest.json a list", lambda c: set_latest(c, "[1, 2]") or ["eval", str(c.run)], 2, "has no \"path\""),
    ("spec.yaml rope_theta edited", lambda c: edit(c.run / "spec.yaml", "rope_theta: 10000.0", "rope_theta: 500000.0") or ["eval", str(c.run)], 2,
     "trained with rope_theta: 10000.0, but spec.yaml says 500000.0"),
    ("spec.yaml norm_eps edited", lambda c: edit(c.run / "spec.yaml", "norm_eps: 1.0e-06", "norm_eps: 1.0e-05") or ["eval", str(c.run)], 2,
     "norm_eps"),
    ("spec.yaml one layer's heads edited", lambda c: edit(c.run / "spec.yaml", "heads: 2,", "heads: 4,") or ["eval", str(c.run)], 2,
     "layers[0].head"),  # heads 4 (head_dim follows: 8): the weights keep their shapes, the stored spec says otherwise
    ("spec.yaml ffn edited", lambda c: edit(c.run / "spec.yaml", "ffn: 64", "ffn: 96") or ["eval", str(c.run)], 2,
     "with shape [32, 64], but spec.yaml builds [32, 96]"),
    ("spec.yaml of another family", lambda c: to_vit(c, "image_size: 8\npatch_size: 4\nchannels: 1\nclasses: 10\n") or ["eval", str(c.run)], 2,
     "has no tensor cls_token, which spec.yaml builds"),
    ("spec.yaml of another family, incomplete", lambda c: to_vit(c, "image_size: 8\npatch_size: 4\nclasses: 10\n") or ["eval", str(c.run)], 2,
     "spec.yaml: channels: is required for family vit"),
    ("spec.yaml with an unknown norm", lambda c: edit(c.run / "spec.yaml", "norm: rmsnorm", "norm: batchnorm") or ["eval", str(c.run)], 2,
     "spec.yaml: norm: unknown value 'batchnorm'"),
    ("spec.yaml with heads not dividing width", lambda c: edit(c.run / "spec.yaml", "heads: 2,", "heads: 3,") or ["eval", str(c.run)], 2,
     "spec.yaml: layers[0].heads: 3 heads do not divide width 32"),
    ("spec.yaml with layers out of order", lambda c: edit(c.run / "spec.yaml", "index: 1,", "index: 0,") or ["eval", str(c.run)], 2,
     "layers[1].index"),
    ("spec.yaml with a duplicate key", lambda c: edit(c.run / "spec.yaml", "width: 32\n", "width: 32\nwidth: 64\n") or ["eval", str(c.run)], 2,
     "'width' is given twice"),
    ("spec.yaml missing", lambda c: (c.run / "spec.yaml").unlink() or ["eval", str(c.run)], 2, "spec.yaml is missing"),
    ("recipe.yaml with a base-60 value", lambda c: edit(c.run / "recipe.yaml", "steps: 10", "steps: 1:10") or ["eval", str(c.run)], 2,
     "recipe.yaml: train.steps: line"),
    ("result.json cut off", lambda c: truncate(c.run / "result.json") or ["export", str(c.run), "--out", str(c.tmp / "x")], 2,
     "result.json: is not valid JSON"),
    ("resume: all checkpoints damaged", lambda c: [truncate(c.newest / "model.safetensors"), truncate(c.older / "optimizer.safetensors")] and
     ["train", str(c.recipe), "--out", str(c.run), "--resume", "--no-progress"], 2, "no intact checkpoint to resume from"),
    ("resume: another recipe", lambda c: ["train", str(c.recipe), "--out", str(c.run), "--resume", "--set", "model.rope_theta=500.0"],
     2, "trained with rope_theta: 10000.0, but the recipe says 500.0"),
    ("resume: no checkpoint at all", lambda c: shutil.rmtree(c.run / "checkpoints") or (c.run / "result.json").unlink() or
     ["train", str(c.recipe), "--out", str(c.run), "--resume", "--no-progress"], 2, "has no checkpoint to resume from"),
    ("resume: a run that ended before its first checkpoint", lambda c: shutil.rmtree(c.run / "checkpoints") or
     ["train", str(c.recipe), "--out", str(c.run), "--resume", "--no-progress"], 2, "ended before its first checkpoint"),
    ("resume: no such folder", lambda c: ["train", str(c.recipe), "--out", str(c.tmp / "never"), "--resume", "--no-progress"], 2,
     "has no checkpoint to resume from"),
]

# Resuming from a damaged newest checkpoint falls back to the previous one and says so: exit 0.
FALLBACKS = [
    ("resume: newest weights truncated", lambda c: truncate(c.newest / "model.safetensors"), "model.safetensors: is not a readable"),
    ("resume: newest optimizer state missing", lambda c: (c.newest / "optimizer.safetensors").unlink(), "optimizer.safetensors: is missing"),
    ("resume: newest optimizer state truncated", lambda c: truncate(c.newest / "optimizer.safetensors"), "optimizer.safetensors: is not a readable"),
    ("resume: newest RNG state missing", lambda c: (c.newest / "rng.safetensors").unlink(), "rng.safetensors: is missing"),
    ("resume: newest RNG state overwritten", lambda c: flip_bytes(c.newest / "rng.safetensors"), "differ from the checksum"),
    ("resume: newest state.json cut off", lambda c: truncate(c.newest / "state.json"), "state.json: is not valid JSON"),
    ("resume: newest state.json of wrong types", lambda c: (c.newest / "state.json").write_text('{"step": "ten"}'), "\"step\" is missing"),
    ("resume: newest weights from another checkpoint", lambda c: shutil.copyfile(c.older / "model.safetensors", c.newest / "model.safetensors"),
     "is not the file this checkpoint was written with"),
    ("resume: latest.json cut off", lambda c: set_latest(c, '{"st') or truncate(c.newest / "state.json"), "latest.json: is not valid JSON"),
]

EXPORTS = [
    ("export: truncated weights", lambda c: truncate(c.export / "model.safetensors") or ["eval", str(c.export)], 2, "not a readable safetensors"),
    ("export: overwritten weight bytes", lambda c: flip_bytes(c.export / "model.safetensors") or ["eval", str(c.export)], 2,
     "differ from the checksum"),
    ("export: spec.yaml rope_theta edited", lambda c: edit(c.export / "spec.yaml", "rope_theta: 10000.0", "rope_theta: 1000.0") or
     ["eval", str(c.export)], 2, "restore the spec.yaml"),
    ("export: spec.yaml one layer's heads edited", lambda c: edit(c.export / "spec.yaml", "heads: 2,", "heads: 8,") or
     ["analyze", str(c.export), "--layer-drop", "--out", str(c.tmp / "a")], 2, "layers[0].head"),
    ("export: metrics.json cut off", lambda c: truncate(c.export / "metrics.json") or
     ["analyze", str(c.export), "--layer-drop", "--tokens", "64", "--out", str(c.tmp / "a")], 2, "metrics.json: is not valid JSON"),
    ("export: weights missing", lambda c: (c.export / "model.safetensors").unlink() or ["eval", str(c.export)], 2, "neither an exported model"),
    ("export into a non-empty folder", lambda c: ["export", str(c.run), "--out", str(c.export)], 2, "pass --force"),
    ("export --force over a folder that is not an export", lambda c: c.write("notes.txt", "mine") and
     ["export", str(c.run), "--out", str(c.tmp), "--force"], 2, "holds the run folder"),
    ("export --force over other files", lambda c: (c.tmp / "other").mkdir() or c.write("other/notes.txt", "mine") and
     ["export", str(c.run), "--out", str(c.tmp / "other"), "--force"], 2, "not an earlier export"),
]

CASES = [*RECIPES, *RUNS, *EXPORTS]


def refuse_to_train(self, *args, **kwargs):
    raise AssertionError("a training step began before the input was refused")


def _run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name,setup,status,needle", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_one_sentence(trained, tmp_path, capsys, monkeypatch, name, setup, status, needle):
    case = Case(tmp_path, trained)
    argv = setup(case)
    monkeypatch.setattr(torch.Tensor, "backward", refuse_to_train)  # a refusal comes before any training step
    code, out, err = _run(argv, capsys)
    assert code == status, err
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 6 and "Traceback" not in err, err
    assert lines[-1].startswith("blockforge") and needle in err, err
    assert out == "", out  # a refusal writes nothing else (generate does not echo the prompt first)


@pytest.mark.parametrize("name,damage,reason", FALLBACKS, ids=[c[0] for c in FALLBACKS])
def test_resume_skips_a_damaged_newest_checkpoint_and_says_why(trained, tmp_path, capsys, name, damage, reason):
    case = Case(tmp_path, trained)
    damage(case)
    code, out, err = _run(["train", str(case.recipe), "--out", str(case.run), "--resume", "--no-progress"], capsys)
    assert code == 0, err
    (line,) = err.strip().splitlines()
    assert "resuming from step-00000005, the newest intact checkpoint" in line and reason in line, line
    assert "completed at step 10" in out
    assert sorted(p.name for p in (case.run / "checkpoints").iterdir()) == ["latest.json", "step-00000005", "step-00000010"]


def test_fallback_resume_reproduces_the_uninterrupted_curve(trained, tmp_path, capsys):
    case = Case(tmp_path, trained)
    reference = [json.loads(x) for x in (case.run / "metrics.jsonl").read_text().splitlines()]
    truncate(case.newest / "model.safetensors")
    assert main(["train", str(case.recipe), "--out", str(case.run), "--resume", "--no-progress"]) == 0
    again = [json.loads(x) for x in (case.run / "metrics.jsonl").read_text().splitlines()]
    losses = lambda lines: [(r["step"], r["loss"]) for r in lines if r["event"] == "train"]  # noqa: E731
    assert losses(again) == losses(reference) and len(losses(reference)) == 2
    assert blockforge.load(case.run).spec.depth == 2


def test_resume_with_nothing_to_resume_touches_nothing(trained, tmp_path, capsys):
    case = Case(tmp_path, trained)
    shutil.rmtree(case.run / "checkpoints")
    (case.run / "result.json").unlink()
    before = {p: p.read_bytes() for p in case.run.rglob("*") if p.is_file()}
    assert main(["train", str(case.recipe), "--out", str(case.run), "--resume", "--no-progress"]) == 2
    assert "has no checkpoint to resume from" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in case.run.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("damage", [
    lambda c: truncate(c.newest / "model.safetensors"),
    lambda c: rewrite_header(c.newest / "model.safetensors", lie_about_dtype),
    lambda c: set_latest(c, '{"path": "../../x"}'),
    lambda c: set_latest(c, "{"),
    lambda c: edit(c.run / "spec.yaml", "rope_theta: 10000.0", "rope_theta: 20000.0"),
    lambda c: flip_bytes(c.newest / "model.safetensors"),
    lambda c: (c.newest / "model.safetensors").write_bytes(b""),
], ids=["truncated", "dtype", "outside", "cut-off-latest", "spec-edit", "bytes", "empty"])
def test_python_load_raises_the_projects_own_error(trained, tmp_path, damage):
    case = Case(tmp_path, trained)
    damage(case)
    with pytest.raises(CorruptFolderError) as caught:
        blockforge.load(case.run)
    assert str(case.run) in str(caught.value) and "\n" not in str(caught.value)


def test_load_of_weights_without_checksums_warns_once_and_loads(trained, tmp_path, capsys):
    """Exports written before checksums: still checked by name, dtype and shape, loaded with one warning."""
    from safetensors.torch import load_file, save_file

    case = Case(tmp_path, trained)
    path = case.export / "model.safetensors"
    save_file(load_file(path), path)  # as an earlier blockforge wrote it: no metadata
    model = blockforge.load(case.export)
    assert model.spec.depth == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "without a checksum" in line and str(path) in line


def test_export_force_replaces_an_earlier_export(trained, tmp_path, capsys):
    case = Case(tmp_path, trained)
    (case.export / "stale.txt").write_text("from an earlier export")
    assert main(["export", str(case.run), "--out", str(case.export), "--force"]) == 0
    assert not (case.export / "stale.txt").exists() and (case.export / "model.safetensors").exists()
    assert blockforge.load(case.export).spec.depth == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left


@pytest.mark.parametrize("argv,status,needle", [
    (["eval", "{run}"], 2, "not a readable safetensors file"),
    pytest.param(["train", "{recipe}", "--out", "{run}", "--resume", "--no-progress"], 0, "resuming from step-00000005", marks=pytest.mark.slow),
    pytest.param(["inspect", "{base60}"], 2, "quote it: at: '1:3'", marks=pytest.mark.slow),
    pytest.param(["export", "{run}", "--out", "{export}"], 2, "pass --force", marks=pytest.mark.slow),
], ids=["eval", "resume-fallback", "base-60", "export-non-empty"])  # the same cases in-process are in the default suite
def test_real_process_shows_no_traceback(trained, tmp_path, argv, status, needle):
    case = Case(tmp_path, trained)
    truncate(case.newest / "model.safetensors")
    base60 = case.write("b.yaml", case.recipe_text().replace("  layers:\n", "  layers:\n    overrides:\n    - {at: 1:3, placement: post}\n"))
    argv = [a.format(run=case.run, recipe=case.recipe, base60=base60, export=case.export) for a in argv]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "blockforge", *argv], capture_output=True, text=True, env=env, timeout=60)
    assert "Traceback" not in done.stderr and needle in done.stderr, done.stderr
    assert done.returncode == status and len(done.stderr.strip().splitlines()) == 1, done.stderr



def test_an_export_holds_no_folder_of_the_node_it_was_trained_on(trained):
    """The run records where its node read the prepared set (the node's cache here); its export, card included, does not,
    and names the set by its fingerprint."""
    run = json.loads((trained / "run" / "data.json").read_text())
    assert run["prepared"].startswith(str(blockforge.data.cache_dir()))
    exported = json.loads((trained / "export" / "data.json").read_text())
    assert "prepared" not in exported and exported["prepared_fingerprint"] == run["prepared_fingerprint"]
    for name in ("data.json", "recipe.yaml", "README.md"):
        assert str(blockforge.data.cache_dir()) not in (trained / "export" / name).read_text(), name

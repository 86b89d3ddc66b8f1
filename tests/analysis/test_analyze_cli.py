"""`blockforge analyze`: recipes, runs and exports in, one figure and one JSON record per analysis out."""

import json

import pytest

import blockforge.cli as cli
from blockforge.export import export_run
from blockforge.spec import load_recipe
from blockforge.train.loop import train

from tiny_setup import write_recipe

ANALYSES = ("grad_norms", "angular_distance", "layer_drop")


@pytest.fixture
def main():
    """blockforge.cli.main, with argparse's own exits turned into return codes."""

    def run(argv: list) -> int:
        try:
            return cli.main([str(a) for a in argv])
        except SystemExit as exit:  # argparse's own errors
            return exit.code

    return run


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny Mix-LN run of 10 steps that logged per-layer gradient norms at steps 5 and 10."""
    folder = tmp_path_factory.mktemp("analysis-run")
    result = train(load_recipe(write_recipe(folder)), folder / "run", progress=False)
    assert result.status == "completed"
    return folder / "run"


def read(out, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


def test_recipes_at_init_give_every_figure_with_its_inputs(tmp_path, main, capsys):
    mix = write_recipe(tmp_path, "mix.yaml")
    post = write_recipe(tmp_path, "post.yaml", alpha=1.0)
    out = tmp_path / "out"
    argv = ["analyze", mix, post, "--all", "--at-init", "--out", out, "--tokens", 1024, "--seeds", "0,1", "--grad-batches", 2, "--batch-size", 4]
    assert main(argv) == 0
    for name in ANALYSES:
        assert (out / f"{name}.json").exists() and (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / "grad_norms_training.json").exists()  # recipes have no training log

    grads = read(out, "grad_norms")
    inputs = grads["inputs"]
    assert [t["path"] for t in inputs["targets"]] == [str(mix), str(post)]
    assert (inputs["seeds"], inputs["tokens"], inputs["batch_size"], inputs["grad_batches"]) == ([0, 1], 1024, 4, 2)
    assert [r["label"] for r in grads["results"]] == ["mix", "post"]
    assert [r["placements"] for r in grads["results"]] == [["post", "pre"], ["post", "post"]]
    for result in grads["results"]:
        assert result["state"] == "init" and len(result["per_batch"]) == 2 * 2 and len(result["mean"]) == 2

    angular = read(out, "angular_distance")["results"][0]
    assert angular["tokens"] == 1024 and sum(angular["samples"].values()) == 1024 // 32
    assert angular["distances"][1][1] is None and 0.0 < angular["distances"][0][0] < 1.0
    drop = read(out, "layer_drop")["results"][0]
    assert drop["metric"] == "val_loss" and len(drop["change"]) == 2 and drop["samples"]["train"] == 0  # validation only

    printed = capsys.readouterr().out
    assert "gradient norm per layer" in printed and "layer-drop" in printed and str(out / "layer_drop.png") in printed


def test_run_and_export_are_measured_at_their_weights_with_the_training_log(tmp_path, trained_run, main):
    export = export_run(trained_run, tmp_path / "export")
    out = tmp_path / "out"
    assert main(["analyze", trained_run, export, "--grad-norms", "--angular", "--out", out, "--tokens", 256,
                 "--grad-batches", 1, "--batch-size", 4]) == 0
    run_result, export_result = read(out, "grad_norms")["results"]
    assert (run_result["label"], export_result["label"]) == ("run", "export")
    assert run_result["state"] == export_result["state"] == "trained" and run_result["step"] == export_result["step"] == 10
    assert run_result["mean"] == pytest.approx(export_result["mean"], rel=1e-5)  # same weights, same batches
    history = read(out, "grad_norms_training")["results"]
    assert [r["label"] for r in history] == ["run"] and history[0]["steps"] == [5, 10] and len(history[0]["norms"][0]) == 2
    assert (out / "grad_norms_training.png").exists() and (out / "angular_distance.png").exists()


def test_a_run_at_init_is_the_model_its_recipe_builds(tmp_path, trained_run, main):
    out = tmp_path / "out"
    argv = ["--grad-norms", "--at-init", "--seeds", "3", "--grad-batches", 1, "--batch-size", 4]
    assert main(["analyze", trained_run, "--out", out / "run", *argv]) == 0
    assert main(["analyze", trained_run / "recipe.yaml", "--out", out / "recipe", *argv]) == 0
    from_run, from_recipe = read(out / "run", "grad_norms")["results"][0], read(out / "recipe", "grad_norms")["results"][0]
    assert from_run["label"] == "run (init)" and from_run["state"] == "init" and from_run["seeds"] == [3]
    assert from_run["mean"] == pytest.approx(from_recipe["mean"], rel=1e-6)


def test_a_vit_recipe_is_analysed_on_images(tmp_path, main):
    out = tmp_path / "out"
    small = ["--set", "model.depth=2", "--set", "model.width=32", "--set", "model.ffn=64"]
    assert main(["analyze", "recipes/vit-digits-mix.yaml", "--all", "--out", out, "--images", 40, "--batch-size", 16,
                 "--seeds", "0", "--grad-batches", 1, "--drop-metric", "val_acc", *small]) == 0
    angular = read(out, "angular_distance")["results"][0]
    assert angular["family"] == "vit" and angular["tokens"] == 40 * (16 + 1)  # all tokens of 40 images
    drop = read(out, "layer_drop")["results"][0]
    assert drop["metric"] == "val_acc" and 0.0 <= drop["baseline"] <= 1.0 and len(drop["change"]) == 2


@pytest.mark.parametrize("argv, message", [
    (["{missing}", "--all", "--out", "{out}"], "no such file or folder"),
    (["{folder}", "--all", "--out", "{out}"], "spec.yaml is missing"),
    (["{recipe}", "--out", "{out}"], "choose at least one analysis"),
    (["{recipe}", "--all"], "--out"),
    (["--all", "--out", "{out}"], "TARGET"),
    (["{recipe}", "--all", "--out", "{out}", "--seeds", "a,b"], "comma-separated"),
    (["{recipe}", "--all", "--out", "{out}", "--tokens", "0"], "--tokens must be 1 or more"),
    (["{recipe}", "--all", "--out", "{out}", "--set", "model.nope=1"], "model.nope"),
    (["{recipe}", "--layer-drop", "--drop-metric", "val_acc", "--out", "{out}"], "val_acc"),
    (["{run}", "--grad-norms", "--out", "{out}", "--set", "model.depth=3"], "--at-init"),
    (["{recipe}", "--grad-norms", "--out", "{recipe}"], "is a file"),
])
def test_bad_input_is_one_line_and_exit_status_2(tmp_path, trained_run, main, capsys, argv, message):
    places = {"missing": tmp_path / "missing", "folder": tmp_path, "recipe": write_recipe(tmp_path), "out": tmp_path / "out", "run": trained_run}
    assert main(["analyze"] + [a.format(**places) for a in argv]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error, error
    assert not (tmp_path / "out").exists()  # nothing is written before the inputs are checked

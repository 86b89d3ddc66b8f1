"""Training runs: determinism, exact resume after SIGKILL or SIGTERM, export round trip, divergence, bad inputs."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

import blockforge
from blockforge.cli import main
from blockforge.export import export_run, load
from blockforge.spec import load_recipe
from blockforge.spec.recipe import Assignment
from blockforge.train.loop import EXIT_DIVERGED, train
from tiny_data import losses


def test_same_seed_same_losses_and_learning(tmp_path, recipe_file):
    recipe = load_recipe(recipe_file())
    a = train(recipe, tmp_path / "a", progress=False)
    b = train(recipe, tmp_path / "b", progress=False)
    assert a.status == b.status == "completed" and a.step == 30
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    first, last = losses(tmp_path / "a")[1], losses(tmp_path / "a")[30]
    assert last < first - 1.0  # it learns
    assert a.metrics["val_ppl"] == pytest.approx(torch.tensor(a.metrics["val_loss"]).exp().item(), rel=1e-5)
    result = json.loads((tmp_path / "a" / "result.json").read_text())
    assert result["status"] == "completed" and result["step"] == 30
    layer_lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines() if "layer_grad_norms" in x]
    assert [r["step"] for r in layer_lines] == [5, 10, 15, 20, 25, 30] and len(layer_lines[0]["layer_grad_norms"]) == 2


def test_resume_after_sigkill_gives_the_same_curve(tmp_path, recipe_file):
    path = recipe_file(steps=120, checkpoint_every=10, eval_every=60)
    reference = train(load_recipe(path), tmp_path / "reference", progress=False)
    assert reference.status == "completed"

    run = tmp_path / "killed"
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))
    # The run kills itself with SIGKILL after step 35 (its last checkpoint at 30), however fast or slow the machine is.
    script = ("import os, signal, blockforge\nfrom blockforge.train.loop import Trainer\n"
              "def die(trainer, step):\n    if step.step == 35:\n        os.kill(os.getpid(), signal.SIGKILL)\n"
              f"Trainer(blockforge.load_recipe({str(path)!r}), {str(run)!r}, progress=False, callbacks=[die]).run()\n")
    killed = subprocess.run([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=1800)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 30
    assert not (run / "result.json").exists()

    resumed = train(load_recipe(path), run, resume=True, progress=False)
    assert resumed.status == "completed"
    assert losses(run) == losses(tmp_path / "reference")
    assert resumed.metrics["val_loss"] == reference.metrics["val_loss"]


@pytest.mark.parametrize("tied", [False, True])
def test_export_load_gives_identical_logits(tmp_path, recipe_file, tied):
    recipe = load_recipe(recipe_file(steps=10), [("model.tie_embeddings", tied)])
    trainer_result = train(recipe, tmp_path / "run", progress=False)
    out = export_run(tmp_path / "run", tmp_path / "export")
    for name in ("model.safetensors", "spec.yaml", "recipe.yaml", "metrics.json", "README.md"):
        assert (out / name).exists(), name
    run_model = load(tmp_path / "run")
    exported = blockforge.export.load(out)
    assert exported.spec.tie_embeddings == tied and not exported.training
    if tied:
        assert exported.head.weight is exported.embed.weight
    tokens = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        assert torch.equal(run_model(tokens), exported(tokens))
    card = (out / "README.md").read_text()
    assert "| 0 | post |" in card and "val_loss" in card
    assert json.loads((out / "metrics.json").read_text())["val_loss"] == trainer_result.metrics["val_loss"]


def test_deep_post_ln_run_is_reported_as_diverged(tmp_path, recipe_file, capsys):
    path = recipe_file(steps=60, warmup=0.0, lr=5.0, eval_every=0)
    code = main(["train", str(path), "--out", str(tmp_path / "run"), "--no-progress",
                 "--set", "model.depth=16", "--set", "model.layers.default.placement=post", "--set", "model.layers.mix_ln.alpha=1.0"])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_DIVERGED
    assert err.count("\n") == 0 and "diverged at step" in err and "Traceback" not in err and "smaller alpha" in err
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "diverged"


def test_a_pre_ln_run_that_diverges_is_not_told_about_alpha(tmp_path, recipe_file, capsys):
    path = recipe_file(steps=60, warmup=0.0, lr=5.0, eval_every=0)
    code = main(["train", str(path), "--out", str(tmp_path / "run"), "--no-progress", "--set", "model.layers.mix_ln.alpha=0.0"])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_DIVERGED and "diverged at step" in err and "lower train.lr" in err and "alpha" not in err


def test_a_run_that_reads_its_loss_only_when_it_logs_still_ends_at_the_step_that_diverged(tmp_path, recipe_file):
    """The loop leaves losses on the device between logged steps; a divergence found when it reads them ends the run at
    the step that diverged, as reading every step would, with the records of the steps before it."""
    path = recipe_file(steps=60, warmup=0.0, lr=5.0, log_every=50, eval_every=0, checkpoint_every=0, grad_norm_every=0)
    every_step = train(load_recipe(path, [Assignment("train.log_every", 1)]), tmp_path / "every", progress=False)
    logged = train(load_recipe(path), tmp_path / "logged", progress=False)
    assert every_step.status == logged.status == "diverged" and 1 < logged.step < 50
    assert logged.step == every_step.step and logged.metrics == every_step.metrics
    records = [json.loads(line) for line in (tmp_path / "logged" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "diverged"] == [logged.step] and max(r["step"] for r in records) == logged.step


def _one_line_failure(argv, capsys, needle):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.count("\n") == 0 and "Traceback" not in err
    assert needle in err, err


def test_missing_text_path(tmp_path, recipe_file, capsys):
    _one_line_failure(["train", str(recipe_file()), "--out", str(tmp_path / "r"), "--set", "data.path=/nowhere/*.txt"], capsys, "data.path")


def test_unknown_tokenizer(tmp_path, recipe_file, capsys):
    _one_line_failure(["train", str(recipe_file()), "--out", str(tmp_path / "r"), "--set", "data.tokenizer={hf: no-such/tokenizer}"], capsys, "data.tokenizer")


def test_unwritable_output_dir(tmp_path, recipe_file, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    _one_line_failure(["train", str(recipe_file()), "--out", str(blocker / "run")], capsys, "cannot write")


def test_existing_run_needs_resume(tmp_path, recipe_file, capsys):
    path = recipe_file(steps=5)
    assert main(["train", str(path), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    capsys.readouterr()
    _one_line_failure(["train", str(path), "--out", str(tmp_path / "run")], capsys, "--resume")


def test_eval_and_export_commands(tmp_path, recipe_file, capsys):
    path = recipe_file(steps=5)
    assert main(["train", str(path), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "export")]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "export")]) == 0
    assert "val_loss" in capsys.readouterr().out
    _one_line_failure(["eval", str(tmp_path / "nowhere")], capsys, "nowhere")


def test_one_seed_pairs_candidates_same_data_order_and_same_initial_weights(tmp_path, recipe_file):
    """Common random numbers: a Pre-LN and a Mix-LN run with one seed see the same batches and start equal."""
    from blockforge.train.loop import Trainer

    path = recipe_file(steps=10)
    pre = Trainer(load_recipe(path, [("model.layers.mix_ln.alpha", 0.0), ("train.seed", 5)]), tmp_path / "pre", progress=False)
    mix = Trainer(load_recipe(path, [("model.layers.mix_ln.alpha", 0.5), ("train.seed", 5)]), tmp_path / "mix", progress=False)
    other = Trainer(load_recipe(path, [("model.layers.mix_ln.alpha", 0.0), ("train.seed", 6)]), tmp_path / "other", progress=False)
    assert pre.spec.post_ln_count() == 0 and mix.spec.post_ln_count() == 1
    a, b, c = (dict(t.model.state_dict()) for t in (pre, mix, other))
    shared = [k for k in a if k in b]
    assert len(shared) > 10 and all(torch.equal(a[k], b[k]) for k in shared)
    assert not torch.equal(a["embed.weight"], c["embed.weight"])
    first = lambda t: next(t.data.train_batches(4, start=0))  # noqa: E731
    assert torch.equal(first(pre), first(mix)) and not torch.equal(first(pre), first(other))


def test_generate_command_continues_a_prompt_from_a_run(tmp_path, recipe_file, capsys):
    path = recipe_file(steps=5, eval_every=0)
    assert main(["train", str(path), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "run"), "--prompt", "the model", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("the model") and out.endswith("\n")
    assert main(["generate", str(tmp_path / "run"), "--prompt", "x", "--max-new-tokens", "500"]) == 2
    assert "context of 32" in capsys.readouterr().err
    # without --max-new-tokens: as many as the context leaves (fewer than 64 here), said once; a prompt that fills it is refused
    assert main(["generate", str(tmp_path / "run"), "--prompt", "the model", "--temperature", "0"]) == 0
    assert "new tokens (the model's context of 32 less the prompt's" in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "run"), "--prompt", "the model " * 40]) == 2
    assert "fill the model's context of 32; shorten the prompt" in capsys.readouterr().err


@pytest.fixture
def one_thread():
    """One torch thread here and in subprocesses: the same numbers on both sides, and no spinning threads on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield dict(os.environ, OMP_NUM_THREADS="1")
    torch.set_num_threads(threads)


def test_sigterm_or_ctrl_c_ends_the_run_cleanly_and_resume_gives_the_same_curve(tmp_path, recipe_file, one_thread):
    """Preemption at a random moment: exit 128+signal, status interrupted, no temporary file, then an exact resume."""
    path = recipe_file(steps=100, checkpoint_every=50, eval_every=50)
    reference = train(load_recipe(path), tmp_path / "reference", progress=False)
    env = one_thread
    for attempt, signum in enumerate((signal.SIGTERM, signal.SIGINT)):
        run = tmp_path / f"run-{attempt}"
        proc = subprocess.Popen([sys.executable, "-m", "blockforge", "train", str(path), "--out", str(run), "--no-progress"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        log = run / "metrics.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and not (log.exists() and '"event": "train"' in log.read_text()):
            time.sleep(0.01)
        time.sleep(random.uniform(0.0, 0.3))  # a random moment after the first logged step
        proc.send_signal(signum)
        err = proc.communicate(timeout=120)[1]
        assert proc.returncode == 128 + signum, err
        assert err.count("\n") == 1 and "Traceback" not in err and f"--out {run} --resume" in err, err
        result = json.loads((run / "result.json").read_text())
        stopped = result["step"]
        assert result["status"] == "interrupted" and 0 < stopped < 100, result
        assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == stopped
        assert [p for p in run.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".partial")] == []
        assert not (run / "run.lock").exists()

        resumed = train(load_recipe(path), run, resume=True, progress=False)
        assert resumed.status == "completed"
        assert losses(run) == losses(tmp_path / "reference")
        assert resumed.metrics["val_loss"] == reference.metrics["val_loss"]


def test_a_signal_through_the_python_api_interrupts_after_the_step(tmp_path, recipe_file):
    from blockforge.train.loop import Trainer

    def preempt(trainer, step):
        if step.step == 7:
            os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    result = Trainer(load_recipe(recipe_file(steps=20)), tmp_path / "run", progress=False, callbacks=[preempt]).run()
    assert result.status == "interrupted" and result.step == 7 and result.signal == signal.SIGTERM
    assert (tmp_path / "run" / "checkpoints" / "step-00000007").is_dir()
    assert signal.getsignal(signal.SIGTERM) is previous  # the handlers are put back


def test_a_resumed_run_writes_each_tensorboard_scalar_once(tmp_path, recipe_file):
    """A run killed after its checkpoint of step 5 logged steps 6-10 already; resumed, it logs them again. metrics.jsonl
    is cut back to the checkpoint, and TensorBoard's event files (which cannot be cut) are written again from it."""
    import shutil

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = recipe_file(steps=10, checkpoint_every=5, eval_every=5, log_every=1, grad_norm_every=0)
    recipe = load_recipe(path, [Assignment("train.tensorboard", True)])
    train(recipe, tmp_path / "run", progress=False)
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-00000010")  # as if killed after step 10 was logged, before its checkpoint
    (tmp_path / "run" / "checkpoints" / "latest.json").unlink()
    (tmp_path / "run" / "result.json").unlink()
    train(recipe, tmp_path / "run", resume=True, progress=False)
    files = list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    events = EventAccumulator(str(files[0]))
    events.Reload()
    steps = [event.step for event in events.Scalars("loss")]
    assert steps == list(range(1, 11))
    assert [e.value for e in events.Scalars("loss")] == pytest.approx(list(losses(tmp_path / "run").values()))

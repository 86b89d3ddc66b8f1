"""The `blockforge` command line: subcommands print what users read, and exit codes mean something."""

import subprocess
import sys

from blockforge.cli import main


def test_inspect_prints_per_layer_table_and_totals(capsys):
    assert main(["inspect", "recipes/llama-tiny-mix.yaml", "--set", "model.depth=4", "--set", "model.layers.mix_ln.alpha=0.5"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["layer", "placement", "heads", "head_dim", "ffn", "init_scale", "lr_mult", "params"]
    rows = [line.split() for line in lines[2:6]]
    assert [r[1] for r in rows] == ["post", "post", "pre", "pre"]
    assert "parameters" in out and "arch hash" in out


def test_inspect_paper_recipe_counts_parameters(capsys):
    assert main(["inspect", "recipes/llama-7b-mix-0.0625.yaml"]) == 0
    out = capsys.readouterr().out
    assert "post x2, pre x30" in out and "6,738,415,616" in out


def test_console_script_help_starts_without_transformers_or_matplotlib():
    """`blockforge --help` (and every command's start) imports neither: each costs about a second on two cores."""
    probe = ("import runpy, sys\nsys.argv = ['blockforge', '--help']\ntry:\n    runpy.run_module('blockforge', run_name='__main__')\n"
             "except SystemExit:\n    pass\nprint('loaded:', sorted(m for m in ('transformers', 'matplotlib') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0 and "inspect" in done.stdout, done.stderr
    assert "loaded: []" in done.stdout, done.stdout[-200:]


def test_output_cut_short_by_a_closed_pipe_is_not_an_error():
    command = [sys.executable, "-m", "blockforge", "inspect", "recipes/llama-7b-mix.yaml"]
    reader = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reader.stdout.readline()
    reader.stdout.close()  # like `| head -1`
    err = reader.stderr.read().decode()
    assert reader.wait(timeout=120) == 0 and "Traceback" not in err, err


def test_inspect_says_when_training_needs_more_memory_than_the_machine_has(capsys):
    from blockforge.cli import main

    assert main(["inspect", "recipes/llama-tiny-mix.yaml", "--set", "model.width=100000000"]) == 0
    out = capsys.readouterr().out
    assert "memory       training needs" in out and "more than the" in out
    assert main(["inspect", "recipes/llama-tiny-mix.yaml"]) == 0
    assert "memory       training needs" not in capsys.readouterr().out

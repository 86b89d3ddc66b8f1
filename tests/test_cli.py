"""The `blockforge` command line: subcommands print what users read, and exit codes mean something."""

import subprocess
import sys

import pytest

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


@pytest.fixture
def language_model(tmp_path):
    """A model folder blockforge generate reads: the tiny llama (context 32) with seeded weights and a small BPE."""
    import blockforge
    from blockforge.data.tokenizer import train_bpe, wrap_bpe
    from blockforge.spec.serialize import save_spec
    from blockforge.train.checkpoint import save_weights
    from tiny_data import tiny_llama, write_corpus

    folder = tmp_path / "model"
    folder.mkdir()
    model = blockforge.build_model(tiny_llama(depth=2), seed=0)
    save_weights(model, folder / "model.safetensors")
    save_spec(model.spec, folder / "spec.yaml")
    corpus = write_corpus(tmp_path / "corpus.txt", documents=60)
    wrap_bpe(train_bpe(corpus.read_text().split("\n\n"), 300), "bpe-300").save(folder / "tokenizer")
    return folder


def test_generate_s_default_count_is_what_the_context_holds_and_says_it_right(language_model, capsys, monkeypatch):
    """Without --max-new-tokens, a short context's share: its context less the prompt's tokens, plus the last new token
    (chosen, never run through the model), said with that arithmetic; one more is refused by the model."""
    import re

    import torch

    from blockforge.errors import BlockforgeError
    from blockforge.nn.llama import Llama

    asked = []
    real = Llama.generate
    monkeypatch.setattr(Llama, "generate", lambda self, tokens, n, **kw: asked.append((self, tokens, n)) or real(self, tokens, n, **kw))
    assert main(["generate", str(language_model), "--prompt", "the model layer norm", "--temperature", "0"]) == 0
    said = re.search(r"generating (\d+) new tokens \(the model's context of 32 less the prompt's (\d+), plus the last new token, "
                     r"which never runs through the model\); --max-new-tokens sets it", capsys.readouterr().err)
    new, prompt = int(said[1]), int(said[2])
    (model, tokens, n), = asked
    assert n == new == 32 - prompt + 1 and tokens.shape == (1, prompt)
    with pytest.raises(BlockforgeError, match="passes the model's context of 32"):
        real(model, tokens, new + 1)
    assert torch.equal(real(model, tokens, new, temperature=0)[:, :prompt], tokens)


def test_generate_refuses_a_prompt_that_is_not_text_in_one_sentence(language_model, capsys):
    """Bytes that are not UTF-8 (Python's argv holds them as lone surrogates), or a prompt that encodes to no token,
    are one sentence before anything is generated."""
    import json
    import os

    assert main(["generate", str(language_model), "--prompt", os.fsdecode(b"caf\xe9 au lait")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ("blockforge: error: --prompt: byte 0xe9 (character 4) is not UTF-8 text; give the "
                                                   "prompt in UTF-8 (a file of another encoding: iconv -t UTF-8 FILE)\n")
    (language_model / "data.json").write_text(json.dumps({"pack": False}))  # no end-of-text token before the prompt
    assert main(["generate", str(language_model), "--prompt", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prompt '': encodes to no token" in err


def test_a_finished_search_exits_though_a_library_thread_would_hold_it_open(tmp_path, monkeypatch):
    """After the summary, a search command ends within its grace however long a library's thread keeps running (what a
    tracker's service or a storage's pool can do): the exit code it computed is kept, and one line says what happened. A
    caller running the command in its own process (main with arguments) is never cut off."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys, threading, time
        from blockforge.cli import search
        threading.Thread(target=time.sleep, args=(600,)).start()  # a library's thread, not a daemon: the interpreter waits for it
        search.end_process(3, grace_s=0.5)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and "a library's threads still held the process open; it exits now" in done.stderr
    from blockforge.cli import main

    calls = []
    monkeypatch.setattr("blockforge.cli.search.end_process", lambda *args: calls.append(args))
    monkeypatch.setattr("blockforge.cli.search.run", lambda args: 0)
    main(["search", "searches/quickstart.yaml"])
    assert not calls


def test_a_finished_search_process_ends_as_the_interpreter_would_less_its_teardown(tmp_path):
    """What the interpreter's exit does that matters is done before the process leaves: a thread that is no daemon
    finishes its work, exit handlers run in their order (a tracker's flush, a temporary folder's removal), buffered output
    is written; and the exit code is the search's."""
    import textwrap
    from pathlib import Path

    script = textwrap.dedent(f"""
        import atexit, sys, tempfile, threading, time
        from pathlib import Path
        from blockforge.cli import search
        out = Path({str(tmp_path)!r})
        threading.Thread(target=lambda: (time.sleep(0.3), (out / "thread").write_text("done"))).start()
        atexit.register(lambda: (out / "handlers").write_text((out / "handlers").read_text() + "first ran last"))
        atexit.register(lambda: (out / "handlers").write_text("last ran first; "))
        temporary = tempfile.TemporaryDirectory()
        (out / "temporary").write_text(temporary.name)
        sys.stdout.write("the summary, unflushed")
        search.end_process(5)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 5, done.stderr
    assert done.stdout == "the summary, unflushed" and done.stderr == ""
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "handlers").read_text() == "last ran first; first ran last"
    assert not Path((tmp_path / "temporary").read_text()).exists()

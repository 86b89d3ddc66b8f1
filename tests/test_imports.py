"""`import blockforge` and the command line import torch (and Ray, transformers, timm, optuna, pandas, matplotlib) only
when a command needs them: --help, a mistyped flag and a refused key answer at once. The names of the package still
resolve, and the family registry is filled whenever anything of blockforge is imported."""

import json
import subprocess
import sys
import textwrap

import pytest

import blockforge

HEAVY = ("torch", "ray", "transformers", "timm", "optuna", "pandas", "matplotlib")


def fresh(code: str, cwd=None) -> dict:
    """What `code` (run in a new interpreter, ending with `result = {...}`) found, with the heavy modules it imported."""
    report = f"\nimport json, sys\nresult['heavy'] = [m for m in {HEAVY!r} if m in sys.modules]\nprint(json.dumps(result))\n"
    script = textwrap.dedent(code) + report
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_blockforge_imports_no_torch_and_fills_the_family_registry():
    found = fresh("""
        import blockforge
        from blockforge.spec.family import FAMILIES, get_family
        result = {"families": sorted(FAMILIES), "build": repr(get_family("llama").build)}
    """)
    assert found == {"families": ["llama", "vit"], "build": "lazy('blockforge.nn.llama:Llama')", "heavy": []}


def test_every_help_a_mistyped_flag_and_the_schemas_answer_without_torch():
    found = fresh("""
        import contextlib, io, json
        from blockforge.cli import build_parser, main

        commands = list(next(a for a in build_parser()._actions if a.dest == "command").choices)
        codes, printed = {}, {}
        for argv in [["--help"], *([name, "--help"] for name in commands), ["search", "--no-such-flag"], ["schema", "recipe"],
                     ["schema", "search"]]:
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                codes[" ".join(argv)] = main(argv)
            printed[" ".join(argv)] = out.getvalue()
        result = {"commands": commands, "codes": codes, "titles": [json.loads(printed[f"schema {k}"])["title"] for k in ("recipe", "search")]}
    """)
    assert {"search", "train", "inspect", "export", "schema"} <= set(found["commands"])
    assert found["codes"].pop("search --no-such-flag") == 2 and set(found["codes"].values()) == {0}
    assert found["titles"] == ["blockforge recipe", "blockforge search file"]
    assert found["heavy"] == []


def test_a_refused_key_in_a_search_file_or_a_recipe_imports_no_torch(tmp_path):
    (tmp_path / "recipe.yaml").write_text("base: base.yaml\nmodel:\n  layers:\n    default: {placment: pre}\n")
    (tmp_path / "base.yaml").write_text("model: {family: llama, width: 32, depth: 2, heads: 2, ffn: 64, vocab: 300, context: 32}\n")
    (tmp_path / "search.yaml").write_text("base: base.yaml\nspace:\n  model.layers.mix_ln.alpha: {uniform: [0.0, 0.5]}\ntrials_per_cel: 4\n")
    (tmp_path / "space.yaml").write_text("base: base.yaml\nspace:\n  model.layers.mix_ln.alfa: {uniform: [0.0, 0.5]}\n")
    found = fresh("""
        import contextlib, io
        from blockforge.cli import main

        said = {}
        for argv in (["search", "search.yaml", "--plan"], ["search", "space.yaml", "--plan"], ["inspect", "recipe.yaml"],
                     ["train", "recipe.yaml", "--out", "run"]):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                said[argv[1] + " " + argv[0]] = [main(argv), err.getvalue()]
        result = {"said": said}
    """, cwd=tmp_path)
    said = found["said"]
    assert all(code == 2 for code, _ in said.values()), said
    assert "trials_per_cel: unknown key; did you mean 'trials_per_cell'?" in said["search.yaml search"][1]
    assert "space.model.layers.mix_ln.alfa: unknown key; did you mean 'alpha'?" in said["space.yaml search"][1]
    assert "model.layers.default.placment: unknown key" in said["recipe.yaml inspect"][1] == said["recipe.yaml train"][1]
    assert found["heavy"] == []


def test_the_package_s_names_resolve_as_before():
    from blockforge import build_model, families, load_recipe, run_search  # noqa: F401
    from blockforge.nn.build import build_model as built_by
    from blockforge.search.api import run_search as runs_by

    assert build_model is built_by and run_search is runs_by and blockforge.families is families
    assert set(blockforge.__all__) == set(blockforge._WHERE) and set(blockforge.__all__) <= set(dir(blockforge))
    assert all(getattr(blockforge, name) is not None for name in blockforge.__all__)
    assert blockforge.search.api.Search is blockforge.Search  # subpackages too, as when the package imported them all
    with pytest.raises(AttributeError, match="no_such_name"):
        blockforge.no_such_name  # noqa: B018  (read for its error)


def test_a_family_s_lazy_hooks_are_the_objects_they_name():
    import pickle

    from blockforge.families.hf_export import HF_FORMAT
    from blockforge.nn.llama import Llama
    from blockforge.spec.family import get_family

    llama = get_family("llama")
    assert llama.build.resolve() is Llama and llama.exports["hf"].library == HF_FORMAT.library == "transformers"
    assert llama.exports["hf"].check is HF_FORMAT.check
    assert pickle.loads(pickle.dumps(llama.loss)).resolve() is llama.loss.resolve()  # a trial on another node gets the same hook

"""Exports served where users serve models, each engine in a Python of its own without blockforge.

- vLLM (CPU build, float32, its Transformers backend): Mix-LN exports (remote code) give transformers' greedy tokens,
  and the chosen tokens' log-probs within 1e-4, plain, with a local:global window pattern, and with grouped-query
  attention.
- llama.cpp (llama-cpp-python): a Pre-LN export with --format gguf tokenizes texts (special-token text included) as the
  transformers export does, gives its greedy tokens, and its logits within 1e-4 with a float32 KV cache.
- transformers 4.57, the oldest release the exports are written for: every open design's export and the Mix-LN
  exports load as the same class and give the logits and token ids that transformers 5 gives.

The engines' Pythons are made by `make serving-venvs` (.venv-vllm, .venv-llamacpp, .venv-transformers4); a test whose
Python is missing is skipped with that command. BLOCKFORGE_VLLM_PYTHON / BLOCKFORGE_LLAMA_CPP_PYTHON /
BLOCKFORGE_TRANSFORMERS4_PYTHON name others.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import blockforge
from blockforge.export import export_run
from blockforge.spec import ModelSpec
from blockforge.spec.model import LayerRules, LayerSettings, MixLN, Pattern
from hf_designs import SOURCES, TEXTS, make_source

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VOCAB = 300  # the BPE of conftest.py


def engine_python(variable: str, venv: str) -> Path:
    python = Path(os.environ.get(variable) or ROOT / venv / "bin" / "python")
    if not python.is_file():
        pytest.skip(f"{python} is missing: run `make serving-venvs` (or set {variable})")
    return python


def run_in(python: Path, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run([str(python), *args], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return next(line for line in reversed(done.stdout.splitlines()) if line.startswith(("[", "{")))  # engines log to stdout too


def mix_ln(**layers) -> ModelSpec:
    """A Mix-LN llama at a head size vLLM's CPU attention takes (32)."""
    rules = LayerRules(default=LayerSettings(placement="pre"), mix_ln=MixLN(alpha=0.25), **layers)
    return ModelSpec(family="llama", width=64, depth=4, heads=2, ffn=128, vocab=VOCAB, context=64, layers=rules)


VARIANTS = {
    "mix-ln": lambda: mix_ln(),
    "mix-ln, local:global windows": lambda: mix_ln(pattern=[Pattern(every=2, set=LayerSettings(window=8))]),
    "mix-ln, grouped-query attention": lambda: ModelSpec(
        family="llama", width=128, depth=4, heads=4, kv_heads=2, ffn=128, vocab=VOCAB, context=64,
        layers=LayerRules(default=LayerSettings(placement="pre"), mix_ln=MixLN(alpha=0.5))),
}


def greedy_with_logprobs(model, prompt: list[int], new: int) -> dict:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False)[0]
        logprobs = torch.log_softmax(model(out[None]).logits[0].float(), dim=-1)
    ids = out[len(prompt):].tolist()
    return {"ids": ids, "logprobs": [logprobs[len(prompt) - 1 + i, token].item() for i, token in enumerate(ids)]}


@pytest.mark.slow
def test_mix_ln_exports_serve_in_vllm_as_transformers_runs_them(model_folder, tmp_path):
    python = engine_python("BLOCKFORGE_VLLM_PYTHON", ".venv-vllm")
    generator = torch.Generator().manual_seed(3)
    prompts = [[0, *torch.randint(2, VOCAB, (n,), generator=generator).tolist()] for n in (4, 11, 19, 27)]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    for name, spec in VARIANTS.items():
        out = export_run(model_folder(spec(), name.replace(" ", "_").replace(",", "").replace(":", "-")), tmp_path / "hf" / name, format="hf")
        assert json.loads((out / "config.json").read_text())["architectures"] == ["BlockforgeForCausalLM"]
        model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32).eval()
        expected = [greedy_with_logprobs(model, prompt, 16) for prompt in prompts]
        served = json.loads(run_in(python, str(HERE.parent / "serving" / "vllm_generate.py"), str(out), str(tmp_path / "prompts.json"), "16"))
        for ours, theirs in zip(expected, served):
            assert theirs["ids"] == ours["ids"], (name, ours, theirs)
            gap = max(abs(a - b) for a, b in zip(ours["logprobs"], theirs["logprobs"]))
            assert gap <= 1e-4, (name, gap)


GGUF_TEXTS = ("The model", " leading space", "line one\nline two", "naïve café 日本 🙂", "<|endoftext|>inside<|endoftext|> text",
              "Numbers 3.14, -42.", "  two  spaces", "<|pad|>")


@pytest.mark.slow
def test_a_pre_ln_export_runs_in_llama_cpp_as_transformers_runs_it(model_folder, tmp_path):
    python = engine_python("BLOCKFORGE_LLAMA_CPP_PYTHON", ".venv-llamacpp")
    spec = ModelSpec(family="llama", width=64, depth=4, heads=4, kv_heads=2, ffn=128, vocab=320, context=64)
    src = model_folder(spec)
    gguf_file = export_run(src, tmp_path / "gguf", format="gguf") / "model.gguf"
    hf = export_run(src, tmp_path / "hf", format="hf")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(hf).eval(), AutoTokenizer.from_pretrained(hf)
    generator = torch.Generator().manual_seed(3)
    prompts = [[0, *torch.randint(2, VOCAB, (n,), generator=generator).tolist()] for n in (4, 11, 19)]
    (tmp_path / "request.json").write_text(json.dumps({"texts": GGUF_TEXTS, "prompts": prompts, "new": 16}))
    served = json.loads(run_in(python, str(HERE.parent / "serving" / "llama_cpp_generate.py"), str(gguf_file), str(tmp_path / "request.json")))
    assert served["texts"] == [tokenizer(text).input_ids for text in GGUF_TEXTS]
    for prompt, greedy, logits in zip(prompts, served["greedy"], served["logits"]):
        with torch.no_grad():
            assert greedy == model.generate(torch.tensor([prompt]), max_new_tokens=16, min_new_tokens=16, do_sample=False)[0, len(prompt):].tolist()
            assert (model(torch.tensor([prompt])).logits[0] - torch.tensor(logits)).abs().max().item() <= 1e-4


READ = r'''
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
import hf_designs as D

results = {}
for name, folder in json.loads(open(sys.argv[1]).read()).items():
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    tokens = torch.randint(0, model.config.vocab_size, (1, 80), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(tokens).logits[0]
    results[name] = {"class": type(model).__name__, "logits": logits.tolist(),
                     "encodings": [tokenizer(text).input_ids for text in D.TEXTS + ("<|endoftext|>inside<|endoftext|> text",)]}
print(json.dumps(results))
'''


@pytest.mark.slow
def test_exports_read_the_same_under_transformers_4_57(model_folder, tmp_path):
    python = engine_python("BLOCKFORGE_TRANSFORMERS4_PYTHON", ".venv-transformers4")
    folders = {}
    for name in SOURCES:
        src = make_source(name, tmp_path / "sources")
        native = blockforge.save(blockforge.from_hf(src), tmp_path / "native" / src.name)
        folders[name] = str(export_run(native, tmp_path / "hf" / src.name, format="hf"))
    for name, spec in VARIANTS.items():
        folders[name] = str(export_run(model_folder(spec(), name.replace(" ", "_").replace(",", "").replace(":", "-")), tmp_path / "hf" / name, format="hf"))
    (tmp_path / "folders.json").write_text(json.dumps(folders))
    (tmp_path / "read.py").write_text(READ)
    old = json.loads(run_in(python, str(tmp_path / "read.py"), str(tmp_path / "folders.json")))
    new = json.loads(run_in(Path(sys.executable), str(tmp_path / "read.py"), str(tmp_path / "folders.json")))
    for name in folders:
        assert old[name]["class"] == new[name]["class"], name
        assert old[name]["encodings"] == new[name]["encodings"], name
        before, after = torch.tensor(old[name]["logits"]), torch.tensor(new[name]["logits"])
        # the two releases' own arithmetic differs slightly (Gemma 2's soft-capping: 2e-5); a RoPE base or scaling read
        # wrongly moves these logits by 0.1 and more
        assert (before - after).abs().max().item() <= 1e-4 and torch.equal(before.argmax(-1), after.argmax(-1)), name

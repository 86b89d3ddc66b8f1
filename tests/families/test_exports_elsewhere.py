"""What leaves blockforge runs where blockforge is not installed: a virtual environment with torch, transformers and peft
but no blockforge loads every export as a user would and compares it with its source.

Seventeen open decoders (tests/hf_designs.py), converted and exported with --format hf, must load as their own class,
give the source's logits within 1e-5 at 64 tokens past their windows, the same greedy tokens, the same tokenizer output
on twenty texts (with and without special tokens), token ids and generation config, and train a peft LoRA step with
peft's default target modules (where peft's table has the model type; else the class's own projection names), and
take a LoRA adapter trained on the source unchanged. A Mix-LN export with a local:global window pattern must give the same logits under
eager and sdpa attention, generate the same tokens with a static cache as with a dynamic one, and hold, after 64
tokens, the KV-cache bytes the search counts for it.
"""

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import blockforge
from blockforge.export import export_run
from blockforge.search.costs import computed_costs
from blockforge.spec import ModelSpec
from blockforge.spec.model import LayerRules, LayerSettings, MixLN, Pattern
from blockforge.spec.recipe import Recipe
from hf_designs import SOURCES, make_source

TESTS = Path(__file__).resolve().parents[1]

CHECK = r'''
import json, sys
from pathlib import Path

try:
    import blockforge  # noqa: F401
    sys.exit("blockforge is importable here")
except ImportError:
    pass
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
from transformers import AutoModelForCausalLM

import hf_designs as D

pairs, mix_ln, counted = json.loads(Path(sys.argv[1]).read_text())
results = {}
for name, (src, out) in pairs.items():
    source, exported = AutoModelForCausalLM.from_pretrained(src).eval(), AutoModelForCausalLM.from_pretrained(out).eval()
    windows = [w for w in (getattr(source.config, "sliding_window", None),) if w]
    tokens = torch.randint(0, D.VOCAB, (2, max(windows, default=0) + 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        delta = (exported(tokens).logits - source(tokens).logits).abs().max().item()
    prompt = tokens[:1, :8]
    same_tokens = torch.equal(exported.generate(prompt, max_new_tokens=16, do_sample=False),
                              source.generate(prompt, max_new_tokens=16, do_sample=False))
    # peft's own default target modules where its table has the model type, else the class's query and value projections
    defaults = source.config.model_type in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    targets = None if defaults else (["qkv_proj"] if source.config.model_type == "phi3" else ["q_proj", "v_proj"])
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(out), LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    trained = [n for n, p in lora.named_parameters() if p.requires_grad]
    step = torch.optim.SGD([p for p in lora.parameters() if p.requires_grad], lr=0.5)
    before = lora(tokens[:, :16], labels=tokens[:, :16]).loss
    before.backward()
    step.step()
    after = lora(tokens[:, :16], labels=tokens[:, :16]).loss.item()
    # an adapter trained on the source loads into the export (the module names are the same) and computes the same
    adapter = Path(out).parent / (Path(out).name + "-adapter")
    tuned = get_peft_model(AutoModelForCausalLM.from_pretrained(src), LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))
    tuned.save_pretrained(adapter)
    moved = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(out), adapter)
    with torch.no_grad():
        adapter_delta = (moved.eval()(tokens).logits - tuned.eval()(tokens).logits).abs().max().item()
        adapter_effect = (tuned(tokens).logits - source(tokens).logits).abs().max().item()
    results[name] = {"class": type(exported).__name__, "delta": delta, "same_tokens": same_tokens,
                     "same_surroundings": D.describe(Path(out)) == D.describe(Path(src)), "peft_defaults": defaults,
                     "lora": bool(trained) and all("lora_" in n for n in trained) and after != before.item(),
                     "adapter_moves": adapter_delta <= 1e-5 and adapter_effect > 1e-3}

eager = AutoModelForCausalLM.from_pretrained(mix_ln, trust_remote_code=True, attn_implementation="eager").eval()
sdpa = AutoModelForCausalLM.from_pretrained(mix_ln, trust_remote_code=True, attn_implementation="sdpa").eval()
tokens = torch.randint(0, eager.config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(2))
with torch.no_grad():
    attention_delta = (eager(tokens).logits - sdpa(tokens).logits).abs().max().item()
prompt = tokens[:1, :40]
static = sdpa.generate(prompt, max_new_tokens=24, do_sample=False, cache_implementation="static")
dynamic = sdpa.generate(prompt, max_new_tokens=24, do_sample=False)
half = AutoModelForCausalLM.from_pretrained(mix_ln, trust_remote_code=True, dtype=torch.bfloat16).eval()
cache = half.generate(prompt, max_new_tokens=25, min_new_tokens=25, do_sample=False, return_dict_in_generate=True).cache
results["mix-ln"] = {"class": type(sdpa).__name__, "attention_delta": attention_delta, "static_equals_dynamic": torch.equal(static, dynamic),
                     "positions": cache.get_seq_length(), "cache_bytes": sum(l.keys.nbytes + l.values.nbytes for l in cache.layers),
                     "counted": counted}
print(json.dumps(results))
'''


def venv_without_blockforge(root: Path) -> Path:
    """A virtual environment that sees this one's packages (torch, transformers, peft) but not blockforge: its site-packages
    are named in a .pth line, which adds the folder but not the editable install's own .pth hooks inside it."""
    import venv

    venv.EnvBuilder(with_pip=False).create(root)
    python = root / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.mark.slow
def test_every_export_runs_in_a_python_without_blockforge(tmp_path, model_folder):
    pairs = {}
    for name in SOURCES:
        src = make_source(name, tmp_path / "sources")
        native = blockforge.save(blockforge.from_hf(src), tmp_path / "native" / src.name)
        pairs[name] = (str(src), str(export_run(native, tmp_path / "hf" / src.name, format="hf")))
    layers = LayerRules(default=LayerSettings(placement="pre"), mix_ln=MixLN(alpha=0.25), pattern=[Pattern(every=2, set=LayerSettings(window=8))])
    spec = ModelSpec(family="llama", width=32, depth=4, heads=4, kv_heads=2, ffn=64, vocab=300, context=64, layers=layers)
    mix_ln = export_run(model_folder(spec), tmp_path / "mix-ln", format="hf")
    counted = computed_costs(Recipe(model=spec), ("kv_cache_bytes",))["kv_cache_bytes"]
    (tmp_path / "pairs.json").write_text(json.dumps([pairs, str(mix_ln), counted]))
    python = venv_without_blockforge(tmp_path / "venv")
    done = subprocess.run([python, "-c", CHECK, str(tmp_path / "pairs.json")], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(TESTS), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, source in SOURCES.items():
        result = results[name]
        assert result["class"] == source.model, (name, result)
        assert result["delta"] <= 1e-5 and result["same_tokens"] and result["same_surroundings"], (name, result)
        assert result["lora"] and result["adapter_moves"], (name, result)
    # peft's table of default target modules lacks some model types (its limitation, not the export's)
    assert sum(results[name]["peft_defaults"] for name in SOURCES) >= 12
    mix = results["mix-ln"]
    assert mix["class"] == "BlockforgeForCausalLM" and mix["attention_delta"] <= 1e-5 and mix["static_equals_dynamic"]
    assert mix["positions"] == 64 and abs(mix["cache_bytes"] - counted) <= 0.01 * counted
    print(json.dumps(results, indent=1), file=sys.stderr)

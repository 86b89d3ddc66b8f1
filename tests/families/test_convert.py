"""Converted models leave as they came: `blockforge convert` and `export --format hf` give back the source's own class,
logits, greedy tokens, tokenizer, token ids and generation config; cards say where a model came from and nothing about
training it did not have; what cannot be converted is refused in one sentence."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import blockforge
from blockforge.cli import main
from blockforge.families.conversion import ConversionError
from hf_designs import SOURCES, TEXTS, VOCAB, describe, make_source


def convert(src, tmp_path, *extra, name="native"):
    assert main(["convert", str(src), "--out", str(tmp_path / name), *extra]) == 0
    return tmp_path / name


def export_hf(native, tmp_path, *extra, name="hf"):
    assert main(["export", str(native), "--out", str(tmp_path / name), "--format", "hf", *extra]) == 0
    return tmp_path / name


def tokens_past_windows(length=64):
    # 64 tokens past every window of the sources (their windows are 10 and 12)
    return torch.randint(0, VOCAB, (2, 12 + length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", ["qwen3", "llama-3.2", "gemma 3"])
def test_a_converted_model_leaves_as_its_own_class_with_everything_around_it(name, tmp_path):
    src = make_source(name, tmp_path / "sources")
    out = export_hf(convert(src, tmp_path), tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [SOURCES[name].model] and "auto_map" not in config
    assert not (out / "modeling_blockforge.py").exists()
    assert describe(out) == describe(src)  # class, token ids, generation config (eos list, sampling), tokenizer on 20 texts
    source_model, exported = AutoModelForCausalLM.from_pretrained(src).eval(), AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(exported) is type(source_model)
    assert set(exported.state_dict()) == set(source_model.state_dict())  # its own module names (q_proj, gate_proj, ...)
    tokens = tokens_past_windows()
    with torch.no_grad():
        assert (exported(tokens).logits - source_model(tokens).logits).abs().max().item() <= 1e-5
    prompt = tokens[:1, :8]
    assert torch.equal(exported.generate(prompt, max_new_tokens=12, do_sample=False),
                       source_model.generate(prompt, max_new_tokens=12, do_sample=False))
    # nothing written names this machine's folders (the source was read from a local path)
    for folder in (out, tmp_path / "native"):
        for file in folder.rglob("*") if folder.is_dir() else ():
            if file.suffix in (".json", ".md", ".yaml"):
                assert str(tmp_path) not in file.read_text(), file


def test_peft_finds_the_default_target_modules_of_an_exported_class(tmp_path):
    from peft import LoraConfig, get_peft_model

    out = export_hf(convert(make_source("qwen3", tmp_path / "sources"), tmp_path), tmp_path)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(out), LoraConfig(r=4, lora_alpha=8))
    trained = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in name for name in trained) and any("q_proj" in name for name in trained)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    tokens = tokens_past_windows(8)
    before = model(tokens, labels=tokens).loss
    before.backward()
    optimizer.step()
    assert model(tokens, labels=tokens).loss.item() != before.item()


def test_convert_straight_to_hf_in_bf16_halves_the_weights(tmp_path):
    src = make_source("mistral v0.1", tmp_path / "sources")
    full = convert(src, tmp_path, "--format", "hf", name="fp32")
    half = convert(src, tmp_path, "--format", "hf", "--dtype", "bf16", name="bf16")
    weights = load_file(half / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert (half / "model.safetensors").stat().st_size < 0.55 * (full / "model.safetensors").stat().st_size
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"
    assert describe(half) == describe(src)


def test_a_half_precision_source_exports_at_its_own_precision_by_default(tmp_path):
    src = make_source("llama-2", tmp_path / "sources")
    AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(src)
    out = export_hf(convert(src, tmp_path), tmp_path)
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}
    assert torch.equal(load_file(out / "model.safetensors")["model.layers.0.mlp.down_proj.weight"],
                       load_file(src / "model.safetensors")["model.layers.0.mlp.down_proj.weight"])


def test_cards_say_where_a_converted_model_came_from_and_not_how_it_trained(tmp_path):
    src = make_source("gemma", tmp_path / "sources")
    native = convert(src, tmp_path, "--base-model", "google/gemma-2b")
    out = export_hf(native, tmp_path)
    for card in ((native / "README.md").read_text(), (out / "README.md").read_text()):
        assert "converted from GemmaForCausalLM" in card and "google/gemma-2b" in card
        for false_claim in ("Every training document", "status:", "optimizer", "## Training"):
            assert false_claim not in card
    header = (out / "README.md").read_text().split("---")[1]
    assert "base_model: google/gemma-2b" in header and "license: gemma" in header
    assert not (out / "metrics.json").exists()


def test_generate_on_a_converted_folder_prompts_stops_and_samples_as_the_source_does(tmp_path, capsys, monkeypatch):
    from transformers import AutoTokenizer

    from blockforge.nn.llama import Llama

    src = make_source("llama-3.2", tmp_path / "sources")  # its generation config samples at temperature 0.6, top_p 0.9
    native = convert(src, tmp_path)
    calls = []
    plain_generate = Llama.generate
    monkeypatch.setattr(Llama, "generate", lambda self, tokens, n, **kw: calls.append((tokens, kw)) or plain_generate(self, tokens, n, **kw))
    assert main(["generate", str(native), "--prompt", "Section 3. The", "--max-new-tokens", "10", "--temperature", "0"]) == 0
    assert main(["generate", str(native), "--prompt", "Section 3. The", "--max-new-tokens", "10"]) == 0
    (tokens, greedy), (_, sampled) = calls
    ids = AutoTokenizer.from_pretrained(src)("Section 3. The", return_tensors="pt").input_ids
    assert torch.equal(tokens, ids) and ids[0, 0] == 0  # the prompt as the tokenizer encodes it: its bos first
    assert greedy["eos_id"] == [1, 4, 5] and greedy["temperature"] == 0  # the flag wins; the eos list stops generation
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (0.6, 0.9, None)  # the source's sampling defaults
    source_model = AutoModelForCausalLM.from_pretrained(src).eval()
    expected = source_model.generate(ids, max_new_tokens=10, do_sample=False)
    assert torch.equal(plain_generate(blockforge.load(native), ids, 10, temperature=0, eos_id=[1, 4, 5])[0, :expected.shape[1]], expected[0])


def test_a_run_trained_with_a_pad_less_hub_tokenizer_exports_its_tokenizer_as_it_is(model_folder, tmp_path):
    from blockforge.spec import ModelSpec

    src = make_source("llama-2", tmp_path / "sources")  # its tokenizer has a bos, no pad
    folder = model_folder(ModelSpec(family="llama", width=32, depth=2, heads=2, ffn=64, vocab=VOCAB, context=32), tokenizer=False)
    (folder / "tokenizer").mkdir()
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (folder / "tokenizer" / file).write_bytes((src / file).read_bytes())
    (folder / "data.json").write_text(json.dumps({"tokenizer": str(src), "pack": True}))
    out = export_hf(folder, tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, None)
    theirs, ours = describe(out), describe(src)
    assert theirs["encodings"] == ours["encodings"] and theirs["special"] == ours["special"]


# Refusals: one sentence each.


def test_a_headless_model_is_refused_by_name(tmp_path, capsys):
    from transformers import LlamaConfig, LlamaModel

    base = LlamaModel(LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=50))
    with pytest.raises(ConversionError, match="LlamaModel is a base model without a language-model head"):
        blockforge.from_hf(base)
    base.save_pretrained(tmp_path / "base")
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "base"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "lm_head.weight" in err and "without its language-model head" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("given,needle", [
    (42, "takes a transformers model .* or the path of its folder, not a int"),
    ("no/such/folder", "no config.json here"),
])
def test_from_hf_says_what_to_pass(given, needle):
    with pytest.raises(ConversionError, match=needle):
        blockforge.from_hf(given)


def test_a_model_type_blockforge_does_not_convert_is_refused_before_loading_weights(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50)).save_pretrained(tmp_path / "gpt2")
    assert main(["convert", str(tmp_path / "gpt2"), "--out", str(tmp_path / "out")]) == 2
    assert "type 'gpt2'; blockforge converts llama, mistral" in capsys.readouterr().err


def test_a_narrow_dtype_in_blockforges_own_format_is_refused(tmp_path, capsys):
    src = make_source("olmo2", tmp_path / "sources")
    native = convert(src, tmp_path)
    capsys.readouterr()
    assert main(["export", str(native), "--out", str(tmp_path / "x"), "--dtype", "bf16"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--dtype bf16: blockforge's own format keeps float32" in err


def test_save_refuses_what_is_not_a_blockforge_model(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=50))
    with pytest.raises(blockforge.BlockforgeError, match="save takes a blockforge model .* not a LlamaForCausalLM"):
        blockforge.save(hf, tmp_path / "x")


def test_the_texts_cover_special_tokens_inside_text():
    assert any("<|im_end|>" in text for text in TEXTS) and len(TEXTS) == 20


@pytest.mark.parametrize("value", ["x\nlicense: stolen", "[a, b", "#not: a comment", "ünïcode/näme"])
def test_card_headers_read_back_any_base_model_and_license_as_given_or_refuse_them(tmp_path, capsys, value):
    import yaml

    src = make_source("gemma", tmp_path / "sources")
    capsys.readouterr()
    if "\n" in value:  # no hub reads a field that spans lines: refused by name, nothing written
        assert main(["convert", str(src), "--out", str(tmp_path / "native"), "--base-model", value]) == 2
        err = capsys.readouterr().err
        assert "--base-model" in err and "one line of printable text" in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "native").exists()
        return
    native = convert(src, tmp_path, "--base-model", value, "--license", value)
    out = export_hf(native, tmp_path)
    header = yaml.safe_load((out / "README.md").read_text().split("---\n")[1])
    assert header["base_model"] == value and header["license"] == value and header["tags"] == ["blockforge"]


def test_convert_and_save_refuse_what_they_cannot_write_in_one_sentence(tmp_path, capsys):
    src = make_source("qwen3", tmp_path / "sources")
    (tmp_path / "afile").write_text("x")
    capsys.readouterr()
    assert main(["convert", str(src), "--out", str(tmp_path / "afile" / "sub")]) == 2  # --out under a file
    err = capsys.readouterr().err
    assert "lies under" in err and "is a file" in err and "Traceback" not in err
    model = blockforge.from_hf(src)
    with pytest.raises(blockforge.BlockforgeError, match="not an empty path"):
        blockforge.save(model, "")
    (src / "generation_config.json").write_text('{"eos_token_id": [1, ')  # cut short in the source
    capsys.readouterr()
    assert main(["convert", str(src), "--out", str(tmp_path / "native")]) == 2
    err = capsys.readouterr().err
    assert "generation_config.json" in err and "not valid JSON" in err and not (tmp_path / "native").exists()


def test_a_kill_left_partial_export_is_cleaned_up_by_the_next_write(tmp_path):
    src = make_source("qwen3", tmp_path / "sources")
    left = tmp_path / ".native.partial-999999999-abcdef12"  # a pid no process has
    left.mkdir()
    (left / "model.safetensors").write_text("half")
    convert(src, tmp_path)
    assert not left.exists()


@pytest.mark.parametrize("key,value,needle", [
    ("eos_token_id", "abc", "eos_token_id is 'abc', not a token id or a list of them"),
    ("temperature", "hot", "temperature is 'hot', not a number"),
    ("top_k", 2.5, "top_k is 2.5, not a whole number"),
    (None, [1, 2], "holds a list, not a mapping of generation settings"),
])
def test_a_generation_config_edited_after_export_is_one_sentence_naming_the_file_and_key(tmp_path, capsys, key, value, needle):
    src = make_source("llama-3.2", tmp_path / "sources")
    native = convert(src, tmp_path)
    path = native / "generation_config.json"
    path.write_text(json.dumps(value if key is None else {**json.loads(path.read_text()), key: value}))
    capsys.readouterr()
    assert main(["generate", str(native), "--prompt", "The", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "generation_config.json" in err and needle in err and "model.safetensors" not in err and len(err.strip().splitlines()) == 1


def test_a_source_record_edited_to_an_unknown_precision_is_refused(tmp_path, capsys):
    src = make_source("qwen3", tmp_path / "sources")
    native = convert(src, tmp_path)
    record = json.loads((native / "source.json").read_text())
    (native / "source.json").write_text(json.dumps({**record, "dtype": "float8"}))
    capsys.readouterr()
    assert main(["export", str(native), "--out", str(tmp_path / "hf"), "--format", "hf"]) == 2
    err = capsys.readouterr().err
    assert "source.json: dtype is 'float8'" in err and len(err.strip().splitlines()) == 1

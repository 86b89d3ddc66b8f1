"""`--format hf`: every llama loads with transformers and computes blockforge.load's logits; its tokenizer and generation work."""

import ast
import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, DynamicCache, LlamaForCausalLM, pipeline

import blockforge
from blockforge.cli import main
from blockforge.errors import BlockforgeError
from blockforge.export import export_run
from blockforge.families import hf_export
from blockforge.families.conversion import ConversionError
from blockforge.spec import ModelSpec
from blockforge.spec.model import LayerOverride, LayerRules, LayerSettings, MixLN

from .conftest import assert_padding_changes_nothing


TOL = 1e-5  # an export computes what blockforge.load computes
VOCAB = 300  # the BPE of conftest.py


def llama(placement="pre", *, mix=None, overrides=(), **kw):
    layers = LayerRules(default=LayerSettings(placement=placement), mix_ln=MixLN(alpha=mix) if mix else None, overrides=list(overrides))
    settings = dict(family="llama", width=32, depth=3, heads=2, ffn=64, vocab=VOCAB, context=32, layers=layers)
    settings.update(kw)
    return ModelSpec(**settings)


def largest_difference(hf_model, folder) -> float:
    ours = blockforge.load(folder)
    tokens = torch.randint(0, VOCAB, (3, 29), generator=torch.Generator().manual_seed(7))
    tokens[0, :2] = torch.tensor([0, 1])  # end-of-text and pad are ordinary rows of the embedding too
    with torch.no_grad():
        return (hf_model.eval()(tokens).logits - ours(tokens)).abs().max().item()


def loaded(out, **kwargs):
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, **kwargs)
    assert not any(info.values()), info  # no weight missing, unexpected or reshaped: none newly initialized
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_a_uniform_pre_ln_llama_is_a_plain_llama_for_causal_lm(model_folder, tmp_path, tied):
    src = model_folder(llama(tie_embeddings=tied))
    out = export_run(src, tmp_path / "hf", format="hf")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "auto_map" not in config
    assert not (out / "modeling_blockforge.py").exists()
    model = loaded(out)
    assert type(model) is LlamaForCausalLM and model.config.tie_word_embeddings == tied
    assert largest_difference(model, src) <= TOL


REMOTE = {
    "mix-ln": llama(mix=0.34),
    "deepnorm": llama("deepnorm"),
    "sandwich": llama("sandwich"),
    "lns": llama("lns"),
    "respost": llama("respost"),
    "tied mix-ln": llama(mix=0.67, tie_embeddings=True),
    "per-layer heads and ffn": llama(overrides=[LayerOverride(at=1, heads=4), LayerOverride(at=2, ffn=48)]),
    "post, layernorm, no final norm": llama("post", norm="layernorm", final_norm=False),
}


@pytest.mark.parametrize("case", list(REMOTE))
def test_every_other_llama_loads_with_its_modeling_file(model_folder, tmp_path, case):
    spec = REMOTE[case]
    src = model_folder(spec)
    out = export_run(src, tmp_path / "hf", format="hf")
    model = loaded(out, trust_remote_code=True)
    assert type(model).__name__ == "BlockforgeForCausalLM"
    ours = blockforge.load(src)
    assert [layer["placement"] for layer in model.config.layers] == [layer.placement for layer in ours.spec.layers]
    assert [(layer["heads"], layer["ffn"]) for layer in model.config.layers] == [(layer.heads, layer.ffn) for layer in ours.spec.layers]
    # blockforge's own parameter names, but for the head, which is where serving engines look for it
    assert set(model.state_dict()) == set(ours.state_dict()) - {"head.weight"} | {"lm_head.weight"}
    if spec.tie_embeddings:
        assert model.lm_head.weight is model.embed.weight and "lm_head.weight" not in load_file(out / "model.safetensors")
    base = AutoModel.from_pretrained(out, trust_remote_code=True).eval()  # the layer stack alone, as vLLM builds it
    assert type(base).__name__ == "BlockforgeModel"
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(base(tokens).last_hidden_state, model(tokens, output_hidden_states=True).hidden_states[-1])
    assert largest_difference(model, src) <= TOL


def test_the_scales_in_the_config_are_the_modules_own(model_folder, tmp_path):
    src = model_folder(llama("deepnorm", depth=4))
    out = export_run(src, tmp_path / "hf", format="hf")
    layers = json.loads((out / "config.json").read_text())["layers"]
    ours = blockforge.load(src)
    for layer, block in zip(layers, ours.layers):
        assert layer["attn"]["residual_scale"] == block.attn.residual_scale == (2.0 * 4) ** 0.25
        assert layer["attn"] == layer["mlp"] and (layer["attn"]["in_norm"], layer["attn"]["out_norm"]) == (False, True)


def test_the_modeling_files_import_only_torch_and_transformers():
    for name in hf_export.REMOTE_FILES:
        tree = ast.parse((hf_export.REMOTE_DIR / name).read_text())
        modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        modules |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}
        assert modules <= {"__future__", "inspect", "torch", "transformers"}, (name, modules)


def test_the_tokenizer_and_the_config_agree_on_special_ids(model_folder, tmp_path, bpe):
    out = export_run(model_folder(llama()), tmp_path / "hf", format="hf")
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = loaded(out)
    eos = bpe.eos_id
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (eos, eos, bpe.pad_id) == (0, 0, 1)
    for config in (model.config, model.generation_config):
        assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (eos, eos, bpe.pad_id)
    text = "Section 3. The model layer norm."
    ids = tokenizer(text).input_ids
    assert ids == [eos] + bpe.encode(text)  # a prompt starts after end-of-text, as every training document did
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.model_max_length == 32


PIECES = ["<|endoftext|>", "<|pad|>", "<|endo", "|>", "<|", " ", "  ", "\n", "model", " layer", "Ünï", "日本", "🙂", "3.5", "\t"]


def test_a_prompt_is_the_ids_the_exported_tokenizer_gives_special_token_text_included(model_folder, tmp_path, bpe):
    """blockforge encodes a prompt as transformers (and the engines that follow its tokenizer.json) encode it: special-token
    text is the special token; a training document splits it into bytes instead, so end-of-text only marks boundaries."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    tokenizer = AutoTokenizer.from_pretrained(export_run(model_folder(llama()), tmp_path / "hf", format="hf"))
    eos = bpe.eos_id
    text = "<|endoftext|>inside<|endoftext|> text"
    assert bpe.encode(text).count(eos) == 2 and tokenizer(text).input_ids == [eos] + bpe.encode(text)
    assert eos not in next(bpe.encode_documents([text]))[:-1]  # the document's own eos only at its end

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=4)), max_size=12))
    def same_ids(pieces):
        prompt = "".join(pieces)
        assert tokenizer(prompt).input_ids == [eos] + bpe.encode(prompt)
        assert tokenizer(prompt, add_special_tokens=False).input_ids == bpe.encode(prompt)

    same_ids()


def test_to_hf_llama_from_python_takes_the_token_ids_export_writes(model_folder, tmp_path):
    src = model_folder(llama())
    written = loaded(export_run(src, tmp_path / "hf", format="hf"))
    converted = blockforge.to_hf_llama(blockforge.load(src))
    for theirs, ours in ((written.config, converted.config), (written.generation_config, converted.generation_config)):
        assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id) == (0, 0, 1)
    # A converted transformers model gives its own ids back; a model with no tokenizer gets none (not LlamaConfig's 1 and 2).
    again = blockforge.to_hf_llama(blockforge.from_hf_llama(converted))
    assert (again.config.bos_token_id, again.config.eos_token_id, again.generation_config.eos_token_id) == (0, 0, 0)
    bare = blockforge.to_hf_llama(blockforge.build_model(llama(), seed=0))
    assert (bare.config.bos_token_id, bare.config.eos_token_id, bare.generation_config.eos_token_id) == (None, None, None)


@pytest.fixture
def mix_ln_export(model_folder, tmp_path):
    src = model_folder(llama(mix=0.34, context=48))
    return src, export_run(src, tmp_path / "hf", format="hf")


def test_greedy_generate_equals_blockforge_token_for_token(mix_ln_export):
    src, out = mix_ln_export
    model = loaded(out, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    ours = blockforge.load(src)
    texts = ["Section 3. The model", "Each layer norm weight is read"]
    singles = []
    for text in texts:
        ids = tokenizer(text, return_tensors="pt").input_ids
        theirs = model.generate(ids, max_new_tokens=14, do_sample=False)
        assert theirs.shape[1] > ids.shape[1]
        assert torch.equal(theirs, ours.generate(ids, 14, temperature=0, eos_id=tokenizer.eos_token_id))
        singles.append(theirs[0, ids.shape[1]:])
    tokenizer.padding_side = "left"  # a batch of prompts of different lengths: padding and positions handled
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    together = model.generate(**batch, max_new_tokens=14, do_sample=False)[:, batch.input_ids.shape[1]:]
    for row, single in zip(together, singles):
        assert torch.equal(row[: len(single)], single)


def test_padded_rows_give_the_logits_of_their_unpadded_selves(mix_ln_export):
    _, out = mix_ln_export
    model = loaded(out, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    assert_padding_changes_nothing(model, tokenizer, ["Section 3. The model", "Each layer norm weight is read"], TOL, same_length=True)


def test_the_kv_cache_gives_the_logits_of_the_whole_sequence(mix_ln_export):
    _, out = mix_ln_export
    model = loaded(out, trust_remote_code=True).eval()
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(tokens).logits
        prefill = model(tokens[:, :5], use_cache=True)
        cache = prefill.cache
        assert isinstance(cache, DynamicCache) and cache.get_seq_length() == 5
        steps = [model(tokens[:, t : t + 1], cache=cache).logits for t in range(5, 9)]
        old_name = model(tokens[:, :5], past_key_values=DynamicCache(config=model.config)).logits  # the former argument name
    torch.testing.assert_close(prefill.logits, full[:, :5], rtol=0, atol=TOL)
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 5:], rtol=0, atol=TOL)
    torch.testing.assert_close(old_name, full[:, :5], rtol=0, atol=TOL)


def test_labels_give_the_next_token_loss_and_hidden_states_every_block_input(mix_ln_export):
    src, out = mix_ln_export
    model = loaded(out, trust_remote_code=True).eval()
    tokens = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        output = model(tokens, labels=tokens, output_hidden_states=True)
        expected = torch.nn.functional.cross_entropy(blockforge.load(src)(tokens)[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    assert output.loss.item() == pytest.approx(expected.item(), abs=1e-5)
    assert len(output.hidden_states) == len(model.layers) + 1


def test_gradient_checkpointing_recomputes_the_blocks_and_gives_the_same_gradients(mix_ln_export):
    _, out = mix_ln_export
    tokens = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(5))

    def gradients(checkpointing: bool):
        model = loaded(out, trust_remote_code=True).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        calls = []
        model.layers[1].attn.register_forward_pre_hook(lambda *args: calls.append(1))
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}, len(calls)

    plain_loss, plain, plain_calls = gradients(False)
    loss, checkpointed, calls = gradients(True)
    assert (plain_calls, calls) == (1, 2)  # the block ran again in the backward pass
    assert loss == plain_loss and plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=0, atol=1e-7, msg=name)


def test_the_text_generation_pipeline_continues_a_prompt(mix_ln_export):
    src, out = mix_ln_export
    generator = pipeline("text-generation", model=str(out), trust_remote_code=True)
    prompt = "Section 3. The model"
    text = generator(prompt, max_new_tokens=8, do_sample=False)[0]["generated_text"]
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids  # the pipeline adds no bos
    expected = blockforge.load(src).generate(ids, 8, temperature=0, eos_id=tokenizer.eos_token_id)
    assert text == tokenizer.decode(expected[0], skip_special_tokens=True) and len(text) > len(prompt)


def test_the_tokenizer_loads_without_the_remote_code_flag_too(mix_ln_export):
    _, out = mix_ln_export
    tokenizer = AutoTokenizer.from_pretrained(out)  # transformers asks about config.json's code, then reads the tokenizer alone
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id) == (0, 1)


def test_the_card_says_how_to_load_it(mix_ln_export):
    _, out = mix_ln_export
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert 'AutoModelForCausalLM.from_pretrained("path/to/this/folder", trust_remote_code=True)' in card
    assert "blockforge.load(" not in card and "| 0 | post |" in card


def test_a_trained_run_exports_from_the_cli(tmp_path, capsys):
    from tiny_data import write_recipe

    recipe = write_recipe(tmp_path, steps=4, eval_every=4, checkpoint_every=4, grad_norm_every=4)
    assert main(["train", str(recipe), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf"), "--format", "hf"]) == 0
    out = capsys.readouterr().out
    assert "(hf format)" in out  # and the line that says how to load it, its code carried in the folder (Mix-LN layers)
    assert f"transformers.AutoModelForCausalLM.from_pretrained('{tmp_path / 'hf'}', trust_remote_code=True)" in out
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "native")]) == 0
    assert f"blockforge.load('{tmp_path / 'native'}'); for transformers, export it with --format hf" in capsys.readouterr().out
    model = loaded(tmp_path / "hf", trust_remote_code=True)
    assert largest_difference(model, tmp_path / "run") <= TOL
    assert (tmp_path / "hf" / "recipe.yaml").exists() and "val_loss" in (tmp_path / "hf" / "README.md").read_text()


# Refusals: one sentence each, and nothing half-written left behind.


def test_a_vit_is_refused_in_one_sentence(model_folder, tmp_path, capsys):
    vit = ModelSpec(family="vit", width=32, depth=2, heads=2, ffn=64, image_size=8, patch_size=4, classes=3)
    src = model_folder(vit, tokenizer=False)
    assert main(["export", str(src), "--out", str(tmp_path / "hf"), "--format", "hf"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--format hf exports llama models" in err and "vit" in err and "blockforge.load" in err
    assert not (tmp_path / "hf").exists()


def test_a_norm_the_modeling_file_does_not_hold_is_refused(model_folder):
    spec = blockforge.load(model_folder(llama())).spec
    with pytest.raises(ConversionError, match="holds rmsnorm, layernorm and dyt llamas, and this one uses scalenorm"):
        hf_export.check(dataclasses.replace(spec, norm="scalenorm"))


def test_a_module_the_modeling_file_does_not_hold_is_refused_by_name(model_folder):
    model = blockforge.load(model_folder(llama()))
    model.layers[1].mlp.branch_norm = torch.nn.LayerNorm(32)
    with pytest.raises(ConversionError, match=r"layers\.1\.mlp\.branch_norm is a LayerNorm"):
        hf_export.remote_config(model)


def test_a_run_without_a_tokenizer_is_refused(model_folder, tmp_path):
    src = model_folder(llama(mix=0.34), tokenizer=False)
    with pytest.raises(BlockforgeError, match="no tokenizer/ folder"):
        export_run(src, tmp_path / "hf", format="hf")
    assert not (tmp_path / "hf").exists() or list((tmp_path / "hf").iterdir()) == []  # nothing half-written


def test_a_refused_comparison_leaves_no_files(model_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(hf_export, "TOLERANCE", -1.0)  # no difference passes
    with pytest.raises(ConversionError, match=r"differ from the original's by \d"):
        export_run(model_folder(llama(mix=0.34)), tmp_path / "hf", format="hf")
    assert not (tmp_path / "hf").exists() or list((tmp_path / "hf").iterdir()) == []  # nothing half-written


def test_an_unknown_format_is_refused(model_folder, tmp_path):
    with pytest.raises(BlockforgeError, match="unknown value 'onnx'"):
        export_run(model_folder(llama()), tmp_path / "x", format="onnx")


@pytest.mark.parametrize("mix", [None, 0.34], ids=["plain LlamaForCausalLM", "remote code"])
def test_load_and_generate_read_a_transformers_export_back(model_folder, tmp_path, capsys, mix):
    src = model_folder(llama(mix=mix, context=48))
    out = export_run(src, tmp_path / "hf", format="hf")
    assert not (out / "spec.yaml").exists()
    back, ours = blockforge.load(out), blockforge.load(src)
    assert back.spec == ours.spec
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        torch.testing.assert_close(back(tokens), ours(tokens), rtol=0, atol=TOL)
    texts = []
    for folder in (src, out):
        assert main(["generate", str(folder), "--prompt", "Section 3. The", "--max-new-tokens", "6", "--temperature", "0"]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and texts[0].startswith("Section 3. The")


def test_a_transformers_folder_blockforge_did_not_write_is_not_taken_for_one(tmp_path):
    from transformers import LlamaConfig

    LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=50)).save_pretrained(tmp_path)
    with pytest.raises(BlockforgeError, match="not a blockforge export"):
        blockforge.load(tmp_path)


def test_target_vllm_refuses_by_name_what_vllm_cannot_run(model_folder, tmp_path, capsys):
    two_windows = llama(mix=0.34, overrides=[LayerOverride(at=0, window=4),
                                             LayerOverride(at=1, window=8)])
    src = model_folder(two_windows)
    assert main(["export", str(src), "--out", str(tmp_path / "refused"), "--format", "hf", "--target", "vllm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "2 window sizes (4, 8)" in err and not (tmp_path / "refused").exists()
    assert main(["export", str(src), "--out", str(tmp_path / "hf"), "--format", "hf"]) == 0  # transformers runs it
    card = (tmp_path / "hf" / "README.md").read_text()  # the card says where it runs and where not
    assert "- vLLM, Transformers backend (tested): cannot: its sliding layers use 2 window sizes (4, 8)." in card
    assert "- llama.cpp (GGUF), CTranslate2, ONNX exporters: cannot;" in card and str(tmp_path) not in card
    one_window = model_folder(llama(mix=0.34, overrides=[LayerOverride(at=[0, 1], window=4)]), "one")
    assert main(["export", str(one_window), "--out", str(tmp_path / "served"), "--format", "hf", "--target", "vllm"]) == 0
    assert main(["export", str(one_window), "--out", str(tmp_path / "gguf"), "--format", "gguf", "--target", "vllm"]) == 2
    assert "--target vllm serves --format hf exports" in capsys.readouterr().err

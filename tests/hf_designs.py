"""Seventeen open decoders as a user finds them on the hub, at toy size: each a transformers folder with random weights
shaped by its real config (windows, softcaps, multipliers, RoPE), a tokenizer built the way its family builds them
(bos or none, pad or none, extra special tokens, a chat template), a generation config (eos lists, sampling defaults)
and a card naming its license. Imports only torch, tokenizers and transformers: a Python without blockforge uses it.

    folder = make_source("qwen3", tmp_path)        # a folder AutoModelForCausalLM and AutoTokenizer read
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

VOCAB = 320
BASE = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, vocab_size=VOCAB,
            max_position_embeddings=128)
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": {"rope_type": "default", "rope_theta": 1e6}}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
CHAT_ML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3_CHAT = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
               "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
GEMMA_CHAT = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
              "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@dataclass(frozen=True)
class Tokens:
    """How a family's tokenizer is built: its special tokens (the first ones get the lowest ids), which it prepends."""

    specials: tuple[str, ...]
    bos: str | None = None
    eos: str | None = None
    pad: str | None = None
    prepend_bos: bool = False
    chat_template: str | None = None


@dataclass(frozen=True)
class Source:
    config: str  # transformers config class
    model: str  # transformers model class
    settings: dict
    tokens: Tokens
    generation: dict = field(default_factory=dict)  # generation_config.json beyond the token ids
    eos_ids: tuple[str, ...] = ()  # the config's eos_token_id: these tokens' ids (a list when several)
    license: str = "apache-2.0"


LLAMA2 = Tokens(("<unk>", "<s>", "</s>"), bos="<s>", eos="</s>", prepend_bos=True)
LLAMA3 = Tokens(("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>"),
                bos="<|begin_of_text|>", eos="<|eot_id|>", prepend_bos=True, chat_template=LLAMA3_CHAT)
QWEN = Tokens(("<|endoftext|>", "<|im_start|>", "<|im_end|>"), eos="<|im_end|>", pad="<|endoftext|>", chat_template=CHAT_ML)
GEMMA = Tokens(("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"), bos="<bos>", eos="<eos>", pad="<pad>",
               prepend_bos=True, chat_template=GEMMA_CHAT)
SAMPLES = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}

SOURCES = {
    "llama-2": Source("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=4), LLAMA2, eos_ids=("</s>",), license="llama2"),
    "llama-3.2": Source("LlamaConfig", "LlamaForCausalLM", dict(head_dim=16, tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE), LLAMA3,
                        SAMPLES, eos_ids=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"), license="llama3.2"),
    "llama, linear rope": Source("LlamaConfig", "LlamaForCausalLM", dict(rope_scaling={"rope_type": "linear", "factor": 4.0}), LLAMA2,
                                 eos_ids=("</s>",)),
    "tinyllama": Source("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=1),
                        Tokens(("<unk>", "<s>", "</s>"), bos="<s>", eos="</s>", pad="</s>", prepend_bos=True), eos_ids=("</s>",)),
    "mistral v0.1": Source("MistralConfig", "MistralForCausalLM", dict(head_dim=16, sliding_window=12), LLAMA2, eos_ids=("</s>",)),
    "mistral v0.3": Source("MistralConfig", "MistralForCausalLM", dict(head_dim=16, sliding_window=None), LLAMA2, {"do_sample": True},
                           eos_ids=("</s>",)),
    "qwen2": Source("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True), QWEN, eos_ids=("<|endoftext|>",)),
    "qwen2, sliding layers": Source("Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=10, max_window_layers=2),
                                    QWEN, {**SAMPLES, "top_k": 20, "repetition_penalty": 1.05}, eos_ids=("<|im_end|>", "<|endoftext|>")),
    "qwen3": Source("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, tie_word_embeddings=True), QWEN,
                    {**SAMPLES, "top_k": 20}, eos_ids=("<|im_end|>", "<|endoftext|>")),
    "olmo2": Source("Olmo2Config", "Olmo2ForCausalLM", {}, Tokens(("<|endoftext|>", "<|pad|>"), eos="<|endoftext|>", pad="<|pad|>"),
                    eos_ids=("<|endoftext|>",)),
    "gemma": Source("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16), GEMMA, eos_ids=("<eos>",), license="gemma"),
    "gemma 2": Source("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=10, query_pre_attn_scalar=16), GEMMA,
                      {"cache_implementation": "hybrid"}, eos_ids=("<eos>", "<end_of_turn>"), license="gemma"),
    "gemma 3": Source("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=16, sliding_window=10, query_pre_attn_scalar=16, num_hidden_layers=6,
                                                                     rope_parameters=GEMMA3_ROPE), GEMMA,
                      {"do_sample": True, "top_k": 64, "top_p": 0.95}, eos_ids=("<eos>", "<end_of_turn>"), license="gemma"),
    "gemma 3, linear rope on global layers": Source(
        "Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=16, sliding_window=10, query_pre_attn_scalar=16, num_hidden_layers=6,
                                                       rope_parameters={**GEMMA3_ROPE, "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                                                          "rope_theta": 1e6}}),
        GEMMA, eos_ids=("<eos>", "<end_of_turn>"), license="gemma"),
    "phi-3": Source("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=12),
                    Tokens(("<unk>", "<s>", "</s>", "<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"), bos="<s>", eos="<|endoftext|>",
                           pad="<|endoftext|>"), eos_ids=("<|endoftext|>", "<|end|>"), license="mit"),
    "smollm3": Source("SmolLM3Config", "SmolLM3ForCausalLM", dict(no_rope_layers=[1, 1, 1, 0], tie_word_embeddings=True),
                      Tokens(("<|endoftext|>", "<|im_start|>", "<|im_end|>"), eos="<|im_end|>", pad="<|endoftext|>", chat_template=CHAT_ML),
                      eos_ids=("<|im_end|>",)),
    "granite": Source("GraniteConfig", "GraniteForCausalLM", dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625,
                                                                   logits_scaling=8.0),
                      Tokens(("<|end_of_text|>", "<fim_prefix>"), bos="<|end_of_text|>", eos="<|end_of_text|>", pad="<|end_of_text|>"),
                      eos_ids=("<|end_of_text|>",)),
}

TEXTS = (  # twenty varied strings a tokenizer must encode as its source does
    "The model", " leading space", "two  spaces\tand a tab", "line one\nline two\n\n", "Numbers 3.14159, 1,000,000 and -42.",
    "naïve café, Straße", "Привет, мир", "こんにちは世界", "emoji 🙂🚀", "def f(x):\n    return x ** 2", "<div class=\"a\">&amp;</div>",
    "snake_case camelCase", "https://example.org/a?b=c#d", "a" * 30, "Mixed 漢字 and 123", "   ", "end.",
    "special inside: <|im_end|> </s> <eos>", "Section 3. The layer norm weight", "¿Qué? ¡Sí!",
)


def training_text() -> list[str]:
    words = "the model layer norm weight gradient loss step train data token batch value returns list string object".split()
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) + f" {i}." for i in range(200)]


def make_tokenizer(tokens: Tokens, folder: Path):
    """A byte-level BPE of VOCAB - 20 tokens with the family's special tokens first, saved into `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 20, special_tokens=list(tokens.specials), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    backend.train_from_iterator(training_text(), trainer)
    if tokens.prepend_bos:
        bos = backend.token_to_id(tokens.bos)
        backend.post_processor = processors.TemplateProcessing(single=f"{tokens.bos} $A", pair=f"{tokens.bos} $A {tokens.bos} $B",
                                                               special_tokens=[(tokens.bos, bos)])
    names = {"bos_token": tokens.bos, "eos_token": tokens.eos, "pad_token": tokens.pad}
    extra = [t for t in tokens.specials if t not in names.values()]
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, **{k: v for k, v in names.items() if v is not None},
                                 additional_special_tokens=extra, model_max_length=BASE["max_position_embeddings"])
    if tokens.chat_template:
        hf.chat_template = tokens.chat_template
    hf.save_pretrained(folder)
    return hf


def make_source(name: str, root: Path, seed: int = 0) -> Path:
    """The folder of source `name`: weights away from their init, tokenizer, generation config, card."""
    import transformers
    from transformers import GenerationConfig

    source = SOURCES[name]
    folder = Path(root) / name.replace(" ", "-").replace(",", "").replace(".", "_")
    folder.mkdir(parents=True)
    tokenizer = make_tokenizer(source.tokens, folder)
    ids = {"bos_token_id": tokenizer.bos_token_id, "pad_token_id": tokenizer.pad_token_id}
    eos = [tokenizer.convert_tokens_to_ids(t) for t in source.eos_ids] or [tokenizer.eos_token_id]
    ids["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    config = getattr(transformers, source.config)(**{**BASE, **source.settings, **ids})
    torch.manual_seed(seed)
    model = getattr(transformers, source.model)(config).eval()
    with torch.no_grad():  # every weight away from its init (Gemma's zero norm gains too), so a missing one shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.generation_config = GenerationConfig(**ids, **source.generation)
    model.save_pretrained(folder)
    (folder / "README.md").write_text(f"---\nlicense: {source.license}\nlibrary_name: transformers\n---\n\n# {name} (toy size)\n")
    return folder


def describe(folder: Path) -> dict:
    """What a user compares between a source and its export: class, token ids, generation config, tokenizer output."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    generation = GenerationConfig.from_pretrained(folder).to_diff_dict()
    generation.pop("transformers_version", None)
    return {
        "architectures": config.architectures, "ids": [config.bos_token_id, config.eos_token_id, config.pad_token_id],
        "generation": generation,
        "special": [tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token, tokenizer.chat_template],
        "encodings": [[tokenizer(t, add_special_tokens=s).input_ids for s in (True, False)] for t in TEXTS],
    }


def json_ready(value):
    return json.loads(json.dumps(value, default=str))

"""Tokenizers: BPE training (deterministic, cached), save/load, HF tokenizers offline, vocabulary checks."""

import pytest

from blockforge.data import TokenizerConfig, load_tokenizer
from blockforge.data import tokenizer as tokenizer_module
from blockforge.data.tokenizer import bpe_tokenizer, build_tokenizer, train_bpe, wrap_bpe
from blockforge.errors import DataError

SAMPLE = "Return the value of the named attribute — naïve café, 日本語, emoji 🙂, and <|endoftext|> as plain text."


def test_bpe_training_is_deterministic(documents):
    assert train_bpe(documents, 300).to_str() == train_bpe(documents, 300).to_str()


def test_bpe_is_cached_by_content(documents, cache_dir, monkeypatch):
    first = bpe_tokenizer(documents, 300, cache_dir)

    def no_training(*args):
        raise AssertionError("the cached tokenizer should have been used")

    monkeypatch.setattr(tokenizer_module, "train_bpe", no_training)
    second = bpe_tokenizer(documents, 300, cache_dir)
    assert second.fingerprint == first.fingerprint
    with pytest.raises(AssertionError, match="cached"):
        bpe_tokenizer(documents[1:], 300, cache_dir)  # other text: another key


def test_bpe_roundtrip_and_special_ids(documents):
    tok = wrap_bpe(train_bpe(documents, 300), "bpe-300")
    assert tok.vocab_size == 300 and tok.eos_id == 0 and tok.pad_id == 1
    ids = tok.encode(SAMPLE)
    assert tok.decode(ids) == SAMPLE  # byte level: any text survives
    assert tok.eos_id in ids  # a prompt: special-token text is the special token, as the exported tokenizer reads it
    (encoded,) = tok.encode_documents([SAMPLE])
    document = encoded.tolist()
    assert tok.eos_id not in document[:-1] and document[-1] == tok.eos_id  # a document: it is ordinary text
    assert tok.decode(document[:-1]) == SAMPLE


def test_save_and_load_give_identical_encodings(documents, tmp_path):
    tok = wrap_bpe(train_bpe(documents, 300), "bpe-300")
    tok.save(tmp_path / "tokenizer")
    loaded = load_tokenizer(tmp_path / "tokenizer")
    assert loaded.encode(SAMPLE) == tok.encode(SAMPLE)
    encoded = lambda tokenizer: [ids.tolist() for ids in tokenizer.encode_documents(documents[:5])]
    assert encoded(loaded) == encoded(tok)
    assert (loaded.vocab_size, loaded.eos_id, loaded.pad_id) == (tok.vocab_size, tok.eos_id, tok.pad_id)
    assert loaded.fingerprint == tok.fingerprint
    with pytest.raises(DataError, match="no saved tokenizer here"):
        load_tokenizer(tmp_path)


def test_bpe_larger_than_the_model_vocabulary_is_rejected(documents, cache_dir):
    with pytest.raises(DataError, match="data.tokenizer.bpe: a vocabulary of 300 tokens does not fit model.vocab 256"):
        build_tokenizer(TokenizerConfig(bpe=300), documents, max_chars=10_000, cache_dir=cache_dir, vocab=256)


def test_unavailable_hf_tokenizer_fails_fast_offline(documents, cache_dir):
    name = "blockforge-tests/no-such-tokenizer"
    with pytest.raises(DataError, match=f"^data.tokenizer.hf: tokenizer '{name}' is not available offline"):
        build_tokenizer(TokenizerConfig(hf=name), documents, max_chars=1, cache_dir=cache_dir, vocab=None)


def test_local_hf_tokenizer_loads_from_a_folder(documents, tmp_path, cache_dir):
    wrap_bpe(train_bpe(documents, 300), "bpe-300").save(tmp_path / "tok")
    tok = build_tokenizer(TokenizerConfig(hf=str(tmp_path / "tok")), documents, max_chars=1, cache_dir=cache_dir, vocab=None)
    assert tok.vocab_size == 300 and tok.name == str(tmp_path / "tok")


def test_bpe_reads_at_most_max_chars(documents, cache_dir, monkeypatch):
    seen = []
    monkeypatch.setattr(tokenizer_module, "train_bpe", lambda texts, size: seen.extend(texts) or train_bpe(texts, size))
    build_tokenizer(TokenizerConfig(bpe=300), iter(documents), max_chars=1000, cache_dir=cache_dir, vocab=None)
    assert seen == documents[: len(seen)] and sum(map(len, seen)) <= 1000


def test_a_bpe_larger_than_its_text_supports_is_capped_and_says_so(documents, cache_dir, capsys):
    """A merge seen a few times (a number, one rare phrase) cannot be learned from the text or met again in
    validation: the BPE stops where merges occur fewer than MIN_MERGE_COUNT times, and a warning says where."""
    tokenizer = bpe_tokenizer(documents, 8192, cache_dir)
    learned = tokenizer.vocab_size
    err = capsys.readouterr().err
    assert 300 < learned < 8192, learned
    assert f"supports {learned} tokens" in err and "data.tokenizer.bpe" in err and len(err.strip().splitlines()) == 1, err
    # Within what the text supports, nothing is said and nothing changes.
    assert bpe_tokenizer(documents, 300, cache_dir).vocab_size == 300 and capsys.readouterr().err == ""


LONG_WORD_TRAINING = """
import random, sys, time
from blockforge.data.tokenizer import train_bpe, wrap_bpe
rng = random.Random(0)
letters = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(1_000_000))
minified = "".join(rng.choice("{}();=,.:+-*/[]") for _ in range(1_000_000))
texts = ["Some ordinary text, a few words long. " * 50, letters + minified, "More ordinary text follows it."]
started = time.perf_counter()
tokenizer = wrap_bpe(train_bpe(texts, 300), "bpe-300")
trained = time.perf_counter() - started
(ids,) = list(tokenizer.encode_documents([texts[1]]))
assert tokenizer.decode(ids[:-1]) == texts[1], "the blob does not decode back"
print(f"trained in {trained:.1f} s", file=sys.stderr)
"""


def test_a_bpe_trains_in_seconds_on_a_text_holding_a_word_of_megabytes():
    """A minified file or a blob without spaces is one pre-token of megabytes, on which every merge of the trainer costs time
    in proportion to its length (2 MB took minutes): the trainer counts it in pieces. The limit only catches a hang."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LONG_WORD_TRAINING], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_bpe_on_ordinary_text_is_the_one_trained_on_whole_words(documents):
    """Cutting long pre-tokens changes nothing where no word is that long: the tokenizer, and so its fingerprint, are the
    ones a trainer of whole words gives."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    whole = Tokenizer(models.BPE())
    whole.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    whole.decoder = decoders.ByteLevel()
    whole.train_from_iterator(documents, trainers.BpeTrainer(
        vocab_size=300, min_frequency=tokenizer_module.MIN_MERGE_COUNT, special_tokens=[tokenizer_module.EOS_TOKEN, tokenizer_module.PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    assert train_bpe(documents, 300).to_str() == whole.to_str()
    assert wrap_bpe(train_bpe(documents, 300), "a").fingerprint == wrap_bpe(whole, "b").fingerprint

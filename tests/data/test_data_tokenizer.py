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

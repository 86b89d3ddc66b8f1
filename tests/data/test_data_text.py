"""Text datasets: rows, packing and padding, resumable batches, validation, token cache, unigram baseline."""

import math
from collections import Counter
from itertools import islice

import numpy as np
import pytest

from blockforge.data import TokenizerConfig
from blockforge.data.text import packed_rows, stream_packed_rows, unigram_perplexity
from blockforge.data.tokenizer import EOS_TOKEN, PAD_TOKEN, train_bpe
from blockforge.errors import DataError


def test_packed_rows_overlap_by_one_token():
    rows = packed_rows(np.arange(10, dtype=np.uint16), 3)
    assert rows.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    assert packed_rows(np.arange(3, dtype=np.uint16), 3).shape == (0, 4)


def test_streamed_packing_equals_packing_the_whole_stream():
    rng = np.random.default_rng(0)
    documents = [rng.integers(0, 100, size=rng.integers(1, 30)).astype(np.uint16) for _ in range(50)]
    streamed = np.stack(list(stream_packed_rows(iter(documents), 7)))
    assert np.array_equal(streamed, packed_rows(np.concatenate(documents), 7))


def test_unigram_perplexity_matches_a_direct_computation():
    train, val, vocab = np.array([0, 0, 1, 2]), np.array([0, 3]), 5
    # add-one: p(0) = (2 + 1) / (4 + 5), p(3) = (0 + 1) / (4 + 5)
    assert unigram_perplexity(train, val, vocab) == pytest.approx(math.exp(-(math.log(3 / 9) + math.log(1 / 9)) / 2))


def split_tokens(rows) -> list[int]:
    """Every token of a split of a packed set, in order."""
    return [t for ids in rows.documents() for t in ids.tolist()]


def test_dataset_unigram_perplexity_uses_train_counts_on_val_tokens(text_config, build_text, text_file):
    ds = build_text(text_config(source="text", path=str(text_file)))
    train, val = split_tokens(ds.train), split_tokens(ds.val)
    counts = Counter(train)
    total, vocab = len(train), ds.tokenizer.vocab_size
    nll = [-math.log((counts[t] + 1) / (total + vocab)) for t in val]
    assert ds.unigram_perplexity() == pytest.approx(math.exp(sum(nll) / len(nll)))


@pytest.mark.parametrize("pack", [True, False])
def test_text_batches_resume_exactly(text_config, build_text, text_file, same_batches, pack):
    ds = build_text(text_config(source="text", path=str(text_file), pack=pack))
    batches_per_epoch = len(ds.train) // 4
    full = list(islice(ds.train_batches(4), 3 * batches_per_epoch))  # three epochs, each reshuffled
    k = batches_per_epoch + 2
    assert same_batches(list(islice(ds.train_batches(4, start=k), len(full) - k)), full[k:])
    assert full[0].shape == (4, 17) and full[0].dtype.is_floating_point is False
    epoch0 = np.concatenate([b.numpy() for b in full[:batches_per_epoch]])
    epoch1 = np.concatenate([b.numpy() for b in full[batches_per_epoch : 2 * batches_per_epoch]])
    assert not np.array_equal(epoch0, epoch1)  # reshuffled
    other_seed = build_text(text_config(source="text", path=str(text_file), pack=pack), seed=1)
    assert not same_batches(list(islice(other_seed.train_batches(4), 3)), full[:3])


def test_validation_is_fixed_and_disjoint_from_training(text_config, build_text, text_file):
    ds = build_text(text_config(source="text", path=str(text_file), pack=False), seq_len=64)
    val = ds.val_batches(3)
    assert all(a.equal(b) for a, b in zip(val, ds.val_batches(3)))
    assert sum(len(b) for b in val) == len(ds.val) == ds.describe()["documents"]["val"]  # one row per validation document
    assert len(ds.val_batches(3, limit=1)) == 1
    decode = lambda row: ds.tokenizer.decode([t for t in row.tolist() if t != ds.pad_id])
    val_texts = {decode(row) for batch in val for row in batch}
    train_texts = {decode(row) for row in ds.train.rows(np.arange(len(ds.train)))}
    assert not val_texts & train_texts


def test_unpacked_rows_are_padded_or_truncated_documents(text_config, build_text, text_file, cache_dir):
    from blockforge.data.corpus import load_corpus

    cfg = text_config(source="text", path=str(text_file), pack=False)
    ds = build_text(cfg, seq_len=64)
    assert ds.pad_id == ds.tokenizer.pad_id != ds.tokenizer.eos_id
    documents = list(ds.tokenizer.encode_documents(load_corpus(cfg, cache_dir).train))  # the training documents, whole
    rows = ds.train.rows(np.arange(len(ds.train)))
    assert len(rows) == len(documents)
    for row, ids in zip(rows, documents):
        assert ids[-1] == ds.tokenizer.eos_id
        if len(ids) <= 65:
            assert row[: len(ids)].tolist() == ids.tolist() and set(row[len(ids) :].tolist()) <= {ds.pad_id}
        else:
            assert row.tolist() == ids[:65].tolist()
    assert {len(ids) <= 65 for ids in documents} == {True, False}  # both cases occur
    assert build_text(text_config(source="text", path=str(text_file))).pad_id is None  # packed: no padding


def test_tokens_are_cached_and_the_tokenizer_saved_with_the_run(
    text_config, build_text, text_file, cache_dir, tmp_path, monkeypatch
):
    cfg = text_config(source="text", path=str(text_file))
    first = build_text(cfg, run_dir=tmp_path / "run")
    assert len(list((cache_dir / "prepared" / "local").glob("*/manifest.json"))) == 1  # the corpus as a prepared set
    from blockforge.data import prepare

    monkeypatch.setattr(prepare, "run_part", lambda *args: pytest.fail("tokens should come from the cache"))
    second = build_text(cfg)
    everything = np.arange(len(first.train))
    assert np.array_equal(first.train.rows(everything), second.train.rows(everything))
    from blockforge.data import load_tokenizer

    assert load_tokenizer(tmp_path / "run" / "tokenizer").encode("a new text") == first.tokenizer.encode("a new text")
    described = first.describe()
    assert described["source"] == "text" and described["tokenizer"] == "bpe-300" and described["pack"] is True
    assert described["documents"]["train"] + described["documents"]["val"] == 80


def test_builtin_dataset_end_to_end(builtin, build_text, same_batches, tmp_path):
    from blockforge.data import DataConfig

    cache_dir, documents = builtin
    cfg = DataConfig(source="builtin", tokenizer=TokenizerConfig(bpe=512))
    build = lambda: build_text(cfg, seq_len=64, vocab=512, cache_dir=cache_dir, run_dir=tmp_path)
    ds = build()
    info = ds.describe()
    assert info["source"] == "builtin" and info["documents"]["train"] + info["documents"]["val"] == len(documents)
    assert info["tokens"]["train"] > 300_000 and isinstance(info["extraction_s"], float)
    assert 1 < ds.unigram_perplexity() < 512
    assert same_batches(list(islice(build().train_batches(8, start=5), 2)), list(islice(ds.train_batches(8), 7))[5:])
    assert (tmp_path / "tokenizer" / "tokenizer.json").is_file()


def test_missing_context_is_named():
    from blockforge.errors import SpecError
    from blockforge.spec import recipe_from_data

    model = {"family": "llama", "width": 16, "depth": 1, "heads": 2, "ffn": 32, "vocab": 300}
    with pytest.raises(SpecError, match="model.context: is required for family llama"):
        recipe_from_data({"model": model, "data": {"source": "builtin"}})


def test_corpus_smaller_than_one_row_is_rejected(text_config, build_text, tmp_path):
    small = tmp_path / "small.txt"
    small.write_text("one short text\n\nand another\n")
    with pytest.raises(DataError, match=r"data.path: the (training|validation) split has \d+ tokens, fewer than one row of"):
        build_text(text_config(source="text", path=str(small)), seq_len=256)


def test_wrong_family_source_is_rejected():
    from blockforge.errors import SpecError
    from blockforge.spec import recipe_from_data

    model = {"family": "llama", "width": 16, "depth": 1, "heads": 2, "ffn": 32, "vocab": 300, "context": 8}
    with pytest.raises(SpecError, match="data.source: 'digits' does not fit model.family llama; choose one of: builtin, text"):
        recipe_from_data({"model": model, "data": {"source": "digits"}})


# --- HF tokenizers: only ids that occur must fit the model ----------------------------------------


@pytest.fixture
def hf_tokenizer_with_unused_tokens(documents, tmp_path):
    """A local HF tokenizer like t5-base: 300 pieces plus 20 sentinel tokens that plain text never produces."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(documents, 300), eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
        additional_special_tokens=[f"<extra_id_{i}>" for i in range(20)],
    )
    hf.save_pretrained(tmp_path / "hf-tok")
    assert len(hf) == 320
    return str(tmp_path / "hf-tok")


def test_unused_tokenizer_ids_beyond_the_model_vocabulary_are_allowed(
    text_config, build_text, text_file, hf_tokenizer_with_unused_tokens
):
    cfg = text_config(source="text", path=str(text_file), tokenizer=TokenizerConfig(hf=hf_tokenizer_with_unused_tokens))
    ds = build_text(cfg, vocab=300)
    assert ds.tokenizer.vocab_size == 320 and int(ds.train.rows(np.arange(len(ds.train))).max()) < 300
    with pytest.raises(DataError, match=r"data.tokenizer: .* produced token id \d+ \(vocabulary 320\) but model.vocab is 200"):
        build_text(cfg, vocab=200)

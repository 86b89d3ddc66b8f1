"""The hf source on a local `datasets` builder (json files), streamed and downloaded."""

from itertools import islice

import numpy as np
import pytest

from blockforge.data.corpus import validation_score
from blockforge.data.prepared import PreparedTextDataset
from blockforge.data.text import StreamingTextDataset
from blockforge.errors import DataError


@pytest.fixture
def json_config(text_config, jsonl_file):
    def make(**settings):
        return text_config(source="hf", dataset="json", path=str(jsonl_file), val_split=None, **settings)

    return make


@pytest.fixture
def training_documents(documents):
    """How many documents the 20% hash hold-out leaves for training."""
    return sum(validation_score(doc) >= 0.2 for doc in documents)


@pytest.mark.parametrize("pack", [True, False])
def test_stream_resumes_exactly_across_epochs(json_config, build_text, same_batches, training_documents, pack):
    ds = build_text(json_config(streaming=True, pack=pack))
    assert isinstance(ds, StreamingTextDataset) and ds.kind == "text"
    full = list(islice(ds.train_batches(8), 24))  # unpacked: 3 epochs of ~64 documents
    for start in (5, 11, 19):
        assert same_batches(list(islice(ds.train_batches(8, start=start), 24 - start)), full[start:])
    assert full[0].shape == (8, 17)
    if not pack:  # epochs are reshuffled: the second epoch is the same documents in another order
        rows = np.concatenate([b.numpy() for b in full])
        epoch0, epoch1 = rows[:training_documents], rows[training_documents : 2 * training_documents]
        assert not np.array_equal(epoch0, epoch1)
        assert sorted(map(tuple, epoch0.tolist())) == sorted(map(tuple, epoch1.tolist()))


def test_stream_validation_is_fixed_and_never_trained_on(json_config, build_text, training_documents):
    ds = build_text(json_config(streaming=True, pack=False), seq_len=256)
    val = ds.val_batches(4)
    assert all(a.equal(b) for a, b in zip(val, ds.val_batches(4)))
    assert [b.tolist() for b in ds.val_batches(4, limit=2)] == [b.tolist() for b in val[:2]]
    rows = lambda batches: {tuple(row) for batch in batches for row in batch.tolist()}
    training = rows(islice(ds.train_batches(8), training_documents // 8 + 1))  # a whole epoch
    assert len(training) == training_documents and not rows(val) & training


@pytest.mark.parametrize("pack", [True, False])
def test_streamed_and_downloaded_datasets_agree(json_config, build_text, pack):
    streamed = build_text(json_config(streaming=True, pack=pack))
    downloaded = build_text(json_config(streaming=False, pack=pack))
    assert isinstance(downloaded, PreparedTextDataset)
    assert streamed.tokenizer.fingerprint == downloaded.tokenizer.fingerprint  # the BPE saw the same text
    assert [b.tolist() for b in streamed.val_batches(4)] == [b.tolist() for b in downloaded.val_batches(4)]
    assert streamed.unigram_perplexity() == pytest.approx(downloaded.unigram_perplexity())
    assert streamed.describe()["streaming"] is True and downloaded.describe()["source"] == "hf"


def test_stream_hold_out_without_documents_is_explained(json_config, build_text):
    ds = build_text(json_config(streaming=True, val_fraction=1e-9))
    with pytest.raises(DataError, match="^data.val_fraction: no document of split 'train' of 'json' falls in the 1e-09 hash"):
        ds.val_batches(4)

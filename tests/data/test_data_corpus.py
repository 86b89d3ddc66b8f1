"""Text sources: the builtin corpus, local text files, `datasets` datasets, and the train/validation split."""

import sys
import time

import pytest

from blockforge.data import DataConfig
from blockforge.data.corpus import (
    builtin_documents,
    extract_stdlib_documents,
    hf_texts,
    load_corpus,
    open_hf_split,
    split_by_hash,
    validation_score,
)
from blockforge.errors import DataError


def test_builtin_corpus_is_deterministic_cached_and_isolated(builtin):
    cache_dir, first = builtin
    started = time.perf_counter()
    cached, info = builtin_documents(cache_dir)
    assert time.perf_counter() - started < 1.0  # read from the cache, not extracted again
    fresh, _ = extract_stdlib_documents()  # a new interpreter, no cache
    assert cached == first == fresh
    assert info["source"] == "builtin" and info["python"] == ".".join(map(str, sys.version_info[:3]))
    assert len(first) > 1000 and sum(map(len, first)) > 1_000_000
    assert len(set(first)) == len(first)  # deduplicated
    assert any(doc.startswith("Prints the values to a stream") for doc in first)  # builtins are documented
    # The extraction imported hundreds of modules in its own process, none in this one.
    assert not {"imaplib", "nntplib", "turtle", "this", "antigravity"} & set(sys.modules)


def test_builtin_split_is_disjoint_and_covers_the_corpus(builtin, monkeypatch):
    cache_dir, documents = builtin
    corpus = load_corpus(DataConfig(source="builtin"), cache_dir)
    assert not set(corpus.train) & set(corpus.val)
    assert sorted(corpus.train + corpus.val) == sorted(documents)
    assert 0.03 < len(corpus.val) / len(documents) < 0.07  # data.val_fraction 0.05


def test_hash_split_is_stable_when_documents_are_added(documents):
    train, val = split_by_hash(documents, 0.2, "data.path")
    more_train, more_val = split_by_hash(documents + [f"Another document {i}." for i in range(40)], 0.2, "data.path")
    assert set(train) <= set(more_train) and set(val) <= set(more_val)
    assert all(validation_score(doc) < 0.2 for doc in val)


def test_hash_split_keeps_duplicates_together_and_never_empties_a_side():
    docs = ["same text"] * 3 + ["other text", "third text"]
    train, val = split_by_hash(docs, 0.001, "data.path")  # nothing scores that low: one is held out anyway
    assert train and val and not set(train) & set(val)
    with pytest.raises(DataError, match="data.path: found 1 distinct"):
        split_by_hash(["only one"] * 4, 0.2, "data.path")


def test_text_files_split_by_blank_lines_without_overlap(text_file, documents):
    corpus = load_corpus(DataConfig(source="text", path=str(text_file), val_fraction=0.2), cache_dir=None)
    assert sorted(corpus.train + corpus.val) == sorted(documents)
    assert not set(corpus.train) & set(corpus.val)
    assert corpus.info == {"source": "text", "files": 1}


def test_text_paths_accept_lists_relative_paths_and_globs(tmp_path, monkeypatch, documents):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "parts").mkdir()
    for i in range(4):
        (tmp_path / "parts" / f"{i}.txt").write_text("\n\n".join(documents[i * 20 : (i + 1) * 20]))
    corpus = load_corpus(DataConfig(source="text", path=["parts/0.txt", "parts/*.txt"]), cache_dir=None)
    assert corpus.info["files"] == 4  # 0.txt named twice, read once
    assert sorted(corpus.train + corpus.val) == sorted(documents)


@pytest.mark.parametrize(
    "path, message",
    [
        ("missing.txt", "data.path: 'missing.txt' is not a file"),
        ("nothing/*.txt", "data.path: the glob 'nothing/\\*.txt' matches no files"),
    ],
)
def test_missing_text_paths_raise_data_errors(tmp_path, monkeypatch, path, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=message):
        load_corpus(DataConfig(source="text", path=path), cache_dir=None)


def test_empty_single_and_binary_text_files_raise_data_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n\n")
    with pytest.raises(DataError, match="data.path: there is no text"):
        load_corpus(DataConfig(source="text", path=str(empty)), cache_dir=None)
    single = tmp_path / "single.txt"
    single.write_text("one paragraph\nover two lines\n")
    with pytest.raises(DataError, match="data.path: found 1 distinct document"):
        load_corpus(DataConfig(source="text", path=str(single)), cache_dir=None)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(DataError, match="data.path: cannot read .* as UTF-8 text"):
        load_corpus(DataConfig(source="text", path=str(binary)), cache_dir=None)


def test_offline_hub_dataset_fails_fast_with_one_sentence(monkeypatch):
    import datasets

    # An endpoint that cannot resolve: the same answer on a machine with or without internet.
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", "https://hub.invalid")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    cfg = DataConfig(source="hf", dataset="allenai/c4", name="en")
    started = time.perf_counter()
    with pytest.raises(DataError, match=r"^data.dataset: cannot reach the Hugging Face Hub to load 'allenai/c4' \(offline\?\)"):
        open_hf_split(cfg, "train", streaming=True)
    assert time.perf_counter() - started < 10


def test_offline_mode_without_a_cached_copy_fails_fast(monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    started = time.perf_counter()
    with pytest.raises(DataError, match="data.dataset: cannot reach the Hugging Face Hub to load 'allenai/c4'"):
        open_hf_split(DataConfig(source="hf", dataset="allenai/c4", name="en"), "train", streaming=False)
    assert time.perf_counter() - started < 10


def test_local_builder_gives_the_same_texts_streamed_or_downloaded(jsonl_file, documents):
    cfg = DataConfig(source="hf", dataset="json", path=str(jsonl_file), val_split=None)
    streamed = list(hf_texts(open_hf_split(cfg, "train", streaming=True), cfg))
    downloaded = list(hf_texts(open_hf_split(cfg, "train", streaming=False), cfg))
    assert streamed == downloaded == documents


def test_local_builder_errors_name_the_key(jsonl_file):
    no_split = DataConfig(source="hf", dataset="json", path=str(jsonl_file), val_split="validation")
    with pytest.raises(DataError, match="^data.val_split: .*'validation'"):
        open_hf_split(no_split, "validation", streaming=True)
    wrong_field = DataConfig(source="hf", dataset="json", path=str(jsonl_file), text_field="body")
    with pytest.raises(DataError, match="^data.text_field: 'json' has no column 'body'; choose one of: text, id"):
        next(hf_texts(open_hf_split(wrong_field, "train", streaming=True), wrong_field))


def test_unparsable_local_files_raise_data_errors(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine"}\n{"text": "no closing brace"\n')
    cfg = DataConfig(source="hf", dataset="json", path=str(broken), val_split=None)
    with pytest.raises(DataError, match="^data.dataset: reading 'json' failed \\(ArrowInvalid: JSON parse error"):
        list(hf_texts(open_hf_split(cfg, "train", streaming=True), cfg))

"""Prepared sets: the rows and batches the text sources always gave, read by index; resume and rank shares by arithmetic;
`blockforge prepare` of recipes and streams; every bad set refused in one sentence."""

import json
import re
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from blockforge.cli import main
from blockforge.data import DataConfig, TokenizerConfig
from blockforge.data.batching import shuffled_batches
from blockforge.data.prepared import Layout, PreparedSet, PreparedTextDataset
from blockforge.data.text import packed_rows, padded_row
from blockforge.errors import DataError


def reference_rows(cfg: DataConfig, seq_len: int, cache_dir: Path, split: str = "train") -> np.ndarray:
    """The rows a finite source gave before prepared sets: its documents tokenized whole, then packed or padded."""
    from blockforge.data.corpus import load_corpus
    from blockforge.data.tokenizer import build_tokenizer

    corpus = load_corpus(cfg, cache_dir)
    tokenizer = build_tokenizer(cfg.tokenizer, corpus.train, max_chars=cfg.bpe_train_chars, cache_dir=cache_dir, vocab=None)
    documents = list(tokenizer.encode_documents(getattr(corpus, split)))
    if cfg.pack:
        return packed_rows(np.concatenate(documents), seq_len)
    return np.stack([padded_row(ids, seq_len, tokenizer.pad_id) for ids in documents])


@pytest.mark.parametrize("pack", [True, False])
def test_a_prepared_text_source_gives_the_rows_and_batches_it_gave_in_memory(text_config, build_text, text_file, cache_dir, pack):
    cfg = text_config(source="text", path=str(text_file), pack=pack)
    ds = build_text(cfg)
    for split, rows in (("train", ds.train), ("val", ds.val)):
        assert np.array_equal(rows.rows(np.arange(len(rows))), reference_rows(cfg, 16, cache_dir, split))
    train = reference_rows(cfg, 16, cache_dir)
    expected = [train[indices] for _, indices in islice(shuffled_batches(len(train), 4, 0, 5), 60)]  # across epochs
    got = list(islice(ds.train_batches(4, start=5), 60))
    assert all(np.array_equal(a.numpy(), b) for a, b in zip(got, expected)) and len(got) == 60


def test_each_rank_reads_its_share_and_the_shares_joined_are_the_one_process_batch(text_config, build_text, text_file):
    ds = build_text(text_config(source="text", path=str(text_file)))
    whole = list(islice(ds.train_batches(8, start=3), 40))
    for ranks in (2, 4):
        shares = [list(islice(ds.train_batches(8, start=3, part=(rank, ranks)), 40)) for rank in range(ranks)]
        for k, batch in enumerate(whole):
            assert all(share[k].shape[0] == 8 // ranks for share in shares)
            assert np.array_equal(np.concatenate([share[k].numpy() for share in shares]), batch.numpy())


@pytest.mark.parametrize("pack", [True, False])
def test_rows_across_shards_and_a_saved_epoch_order_give_the_same_batches(tmp_path, text_config, text_file, monkeypatch, pack):
    """A set cut into many parts (windows across shard ends; a batch's documents in many shards) reads the rows of one
    part; a large set's epoch order, kept in the cache once drawn, is the order drawn again."""
    from blockforge.data import prepare as prepare_module
    from blockforge.data import prepared as prepared_module
    from blockforge.data.prepare import Request, prepare

    cfg = text_config(source="text", path=str(text_file), pack=pack)
    layout = Layout(pack=pack, context=16)
    prepare(Request(cfg, layout), tmp_path / "one", progress=False)
    monkeypatch.setattr(prepare_module, "PART_CHARS", 300)  # a few documents per part
    outcome = prepare(Request(cfg, layout), tmp_path / "many", progress=False)
    assert len(outcome.manifest.splits["train"].shards) > 10
    one, many = (PreparedTextDataset(PreparedSet.open(tmp_path / name), seq_len=16, vocab=None, seed=0) for name in ("one", "many"))
    assert np.array_equal(one.train.rows(np.arange(len(one.train))), many.train.rows(np.arange(len(many.train))))
    monkeypatch.setattr(prepared_module, "SAVED_ORDER_ROWS", 1)
    saved = PreparedTextDataset(PreparedSet.open(tmp_path / "many"), seq_len=16, vocab=None, seed=0)
    for _ in range(2):  # drawn and kept, then read back
        batches = list(islice(saved.train_batches(4, start=len(saved.train)), 5))  # the second epoch
        assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(batches, islice(one.train_batches(4, start=len(one.train)), 5)))
    assert list((prepared_module.cache_root() / "prepared" / "orders").glob("order-*.npy"))


# ---- training on a prepared set ---------------------------------------------------------------------------


def _read(run: Path) -> list:
    return [(r["step"], r.get("loss"), r.get("val_loss")) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["event"] in ("train", "eval")]


@pytest.mark.parametrize("pack", [True, False])
def test_training_on_a_prepared_set_equals_training_on_the_source_and_resumes_exactly(tmp_path, pack, monkeypatch):
    """`blockforge prepare` then data.prepared gives the per-step losses of the run that reads the source itself; a run
    stopped by SIGTERM on it resumes onto the same curve."""
    import os
    import signal

    import yaml

    from blockforge.spec import load_recipe
    from blockforge.train.loop import Trainer, train
    from tiny_data import tiny_recipe

    recipe = tiny_recipe(tmp_path, steps=12, log_every=1, eval_every=6, checkpoint_every=4, grad_norm_every=0)
    recipe["data"]["pack"] = pack
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["prepare", str(path), "--out", str(tmp_path / "set"), "--no-progress"]) == 0
    source = train(load_recipe(path), tmp_path / "source", progress=False)
    from blockforge.spec.recipe import Assignment

    on_set = load_recipe(path, [Assignment("data.prepared", str(tmp_path / "set"))])
    reference = train(on_set, tmp_path / "prepared", progress=False)
    assert _read(tmp_path / "source") == _read(tmp_path / "prepared") and reference.metrics == source.metrics
    data = json.loads((tmp_path / "prepared" / "data.json").read_text())
    assert data["prepared"] == str(tmp_path / "set") and data["pack"] is pack

    def preempt(trainer, step):
        if step.step == 7:
            os.kill(os.getpid(), signal.SIGTERM)

    stopped = Trainer(on_set, tmp_path / "stopped", progress=False, callbacks=[preempt]).run()
    assert stopped.status == "interrupted" and stopped.step == 7
    resumed = train(on_set, tmp_path / "stopped", resume=True, progress=False)
    assert resumed.status == "completed" and _read(tmp_path / "stopped") == _read(tmp_path / "prepared")


def test_a_stream_prepared_to_a_budget_trains_as_the_same_documents_read_in_memory(tmp_path, jsonl_file, documents):
    """A local JSON set read as a `datasets` stream, prepared to --tokens N, holds the stream's first documents in order;
    a run on it equals a run on exactly those documents read in memory."""
    import yaml

    from blockforge.data.corpus import validation_score
    from blockforge.spec import load_recipe
    from blockforge.spec.recipe import Assignment
    from blockforge.train.loop import train
    from tiny_data import TINY_LLAMA

    base = {"model": {**TINY_LLAMA, "depth": 2, "vocab": 300, "context": 16},
            "train": {"steps": 8, "batch_size": 4, "micro_batch_size": 2, "lr": 3e-3, "warmup": 0.1, "log_every": 1, "eval_every": 8,
                      "eval_batches": 2, "checkpoint_every": 8}}
    stream = {**base, "data": {"source": "hf", "dataset": "json", "path": str(jsonl_file), "val_split": None, "val_fraction": 0.2,
                               "streaming": True, "pack": False, "tokenizer": {"bpe": 300},
                               "bpe_train_chars": 2000}}  # both BPEs learn from the same first documents
    (tmp_path / "stream.yaml").write_text(yaml.safe_dump(stream))
    assert main(["prepare", str(tmp_path / "stream.yaml"), "--out", str(tmp_path / "set"), "--tokens", "480", "--no-progress"]) == 0
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    assert manifest["requested_tokens"] == 480 and manifest["splits"]["train"]["documents"] == 30  # 480 / 16 rows, one per document
    # The same documents, in memory: the stream's up to its 30th training document (the held-out ones among them too).
    taken, kept = [], 0
    for text in documents:
        taken.append(text)
        kept += validation_score(text) >= 0.2
        if kept == 30:
            break
    (tmp_path / "same.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in taken))
    memory = {**stream, "data": {**stream["data"], "path": str(tmp_path / "same.jsonl"), "streaming": False}}
    (tmp_path / "memory.yaml").write_text(yaml.safe_dump(memory))
    train(load_recipe(tmp_path / "memory.yaml"), tmp_path / "memory", progress=False)
    train(load_recipe(tmp_path / "stream.yaml", [Assignment("data.prepared", str(tmp_path / "set"))]), tmp_path / "on-set", progress=False)
    assert _read(tmp_path / "memory") == _read(tmp_path / "on-set")


def test_a_search_file_is_prepared_into_the_folders_its_search_reads(tmp_path, capsys):
    """For a search file: the data of its base recipe with its overrides, one set per distinct data and layout, under
    OUT/data/<fingerprint>/; --plan says the figures first."""
    import yaml

    from tiny_data import tiny_recipe

    (tmp_path / "base.yaml").write_text(yaml.safe_dump(tiny_recipe(tmp_path, steps=10)))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "cells": {"model.context": [16, 32]},
                                                     "space": {"model.layers.mix_ln.alpha": {"uniform": [0.0, 0.5]}}}))
    assert main(["prepare", str(tmp_path / "s.yaml"), "--plan"]) == 0
    planned = capsys.readouterr().out
    assert planned.count("data/") == 2 and "core-hours" in planned and "context=16" in planned
    assert main(["prepare", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    sets = sorted((tmp_path / "out" / "data").glob("*/manifest.json"))
    assert len(sets) == 2 and {json.loads(p.read_text())["layout"]["context"] for p in sets} == {16, 32}
    for path in sets:
        assert path.parent.name in planned


# ---- bad input: one sentence, nothing lost -----------------------------------------------------------------


@pytest.fixture
def prepared(tmp_path, text_config, text_file):
    """A prepared set of the generated corpus (packed, context 16) and its DataConfig."""
    from blockforge.data.prepare import Request, prepare

    cfg = text_config(source="text", path=str(text_file))
    prepare(Request(cfg, Layout(pack=True, context=16)), tmp_path / "set", progress=False)
    return tmp_path / "set", cfg


def _open(cfg: DataConfig, where, **settings):
    from blockforge.data.text import build_text_dataset

    settings = {"seq_len": 16, "vocab": 512, "seed": 0, "cache_dir": Path(where).parent / "cache", "run_dir": None, **settings}
    return build_text_dataset(DataConfig(**{**cfg.__dict__, "prepared": str(where)}), **settings)


def test_a_set_for_other_data_is_refused_naming_the_key(prepared):
    where, cfg = prepared
    assert len(_open(cfg, where).train) > 0
    cases = [
        (dict(), {"seq_len": 32}, "holds rows for model.context 16, but the recipe has 32"),
        (dict(pack=False), {}, "holds packed rows (data.pack true), but the recipe has data.pack false"),
        (dict(tokenizer=TokenizerConfig(bpe=400)), {}, 'was prepared with data.tokenizer = {"bpe": 300}, but the recipe has {"bpe": 400}'),
        (dict(val_fraction=0.3), {}, "was prepared with data.val_fraction = 0.2, but the recipe has 0.3"),
        (dict(path="other.txt"), {}, "was prepared with data.path = "),
        (dict(), {"vocab": 100}, "(bpe-300, vocabulary 300), but model.vocab is 100; raise model.vocab"),
    ]
    for changes, settings, message in cases:
        with pytest.raises(DataError) as refused:
            _open(DataConfig(**{**cfg.__dict__, **changes}), where, **settings)
        assert str(refused.value).startswith(f"data.prepared: {where} ") and message in str(refused.value), str(refused.value)


def test_a_missing_cut_damaged_or_foreign_set_is_one_sentence_naming_the_file(prepared, tmp_path):
    where, cfg = prepared
    with pytest.raises(DataError, match=f"^data.prepared: {tmp_path / 'nowhere'} holds no prepared set .there is no manifest.json.; "
                                        "prepare one with `blockforge prepare RECIPE --out"):
        _open(cfg, tmp_path / "nowhere")
    shard = where / "train" / "000000.bin"
    data = shard.read_bytes()
    shard.write_bytes(data[:-2])
    with pytest.raises(DataError, match=f"^data.prepared: {where}/train/000000.bin holds {len(data) - 2:,} bytes, not the {len(data):,}"):
        _open(cfg, where)
    shard.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # the right size, one bit changed: refused when first read
    with pytest.raises(DataError, match=f"^data.prepared: {where}/train/000000.bin fails its checksum"):
        _open(cfg, where).train.rows(np.arange(1))
    shard.write_bytes(data)
    assert len(_open(cfg, where).train) > 0
    manifest = where / "manifest.json"
    for garbage, why in (("{not json", "it does not read as JSON"), ('{"kind": "something else"}', "it does not say it is one"),
                         (json.dumps({**json.loads(manifest.read_text()), "format": 99}), "format 99")):
        saved = manifest.read_text()
        manifest.write_text(garbage)
        with pytest.raises(DataError, match=f"^data.prepared: {where}/manifest.json is not the manifest of a prepared set .{why}"):
            _open(cfg, where)
        manifest.write_text(saved)


def _edited(where: Path, edit) -> None:
    manifest = json.loads((where / "manifest.json").read_text())
    edit(manifest)
    (where / "manifest.json").write_text(json.dumps(manifest))


def test_shard_bytes_are_checked_when_first_read_and_a_manifest_that_disagrees_with_its_files_is_refused(prepared):
    """A flipped bit whose file keeps its time (bit rot) is refused when a run first reads the shard, in a node's copy
    too (removed there, to be taken down again); a manifest whose counts, dtype or offsets disagree with its files is
    refused when the set is opened, and one whose max_token_id is below its ids before any row is given out."""
    import os

    where, cfg = prepared
    assert len(_open(cfg, where).train.rows(np.arange(4))) == 4  # checked once; a later run checks again
    shard = where / "train" / "000000.bin"
    saved, stat = shard.read_bytes(), shard.stat()
    shard.write_bytes(saved[:101] + bytes([saved[101] ^ 4]) + saved[102:])
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    reader = _open(cfg, where)
    with pytest.raises(DataError, match=f"^data.prepared: {where}/train/000000.bin fails its checksum"):
        reader.train.rows(np.arange(4))
    manifest = PreparedSet.open(where).manifest
    copy = PreparedSet(where, manifest, "s3://bucket/sets/tiny", node_copy=True)
    with pytest.raises(DataError, match=f"^data.prepared: {shard}, this node's copy of s3://bucket/sets/tiny/train/000000.bin, fails "
                                        "its checksum .damaged on this disk.; it is removed, and the next run takes it down again"):
        copy.split("train", None).rows(np.arange(1))
    assert not shard.exists()
    shard.write_bytes(saved)
    original = (where / "manifest.json").read_text()
    tokens = manifest.splits["train"].tokens

    def counts(factor, dtype=None):
        def edit(m):
            shard, split = m["splits"]["train"]["shards"][0], m["splits"]["train"]
            shard["tokens"] = split["tokens"] = int(tokens * factor)
            m["dtype"] = dtype or m["dtype"]
        return edit

    cases = [(counts(0.5), f"splits.train.shards[0].tokens is {tokens // 2:,}, but train/000000.bin is recorded with {tokens * 2:,} bytes"),
             (counts(2), f"splits.train.shards[0].tokens is {tokens * 2:,}, but train/000000.bin is recorded with {tokens * 2:,} bytes"),
             (counts(1, "uint32"), f"{tokens // 2:,} uint32 ids"),
             (lambda m: (counts(0.5)(m), m.update(requested_tokens=10**6)),  # a stream's last shard may be cut: at a document only
              f"of {tokens // 2:,} tokens, but train/000000.idx puts them at tokens 0 to {tokens:,}; the manifest or the index was changed")]
    for edit, message in cases:
        _edited(where, edit)
        with pytest.raises(DataError) as refused:
            _open(cfg, where)
        assert str(refused.value).startswith(f"data.prepared: {where}/manifest.json") and message in str(refused.value), str(refused.value)
        (where / "manifest.json").write_text(original)
    _edited(where, lambda m: m.update(max_token_id=50))
    reader = _open(cfg, where, vocab=100)  # the manifest says its ids fit
    with pytest.raises(DataError, match=f"^data.prepared: {where}/manifest.json: max_token_id is 50, but train/000000.bin holds id 2"):
        reader.train.rows(np.arange(1))


def test_a_manifest_that_lists_a_shard_twice_or_out_of_order_is_refused_naming_the_key(prepared, tmp_path, capsys):
    """A shard listed twice (its split's counts doubled to match) would be trained on twice; shards out of the order they
    were written in give other rows. Either is one sentence naming the manifest and the key, from a run and from `prepare`."""
    import shutil

    where, cfg = prepared
    for kind in ("bin", "idx"):  # a second shard of the same bytes
        shutil.copyfile(where / "train" / f"000000.{kind}", where / "train" / f"000001.{kind}")
    original = (where / "manifest.json").read_text()

    def listing(*names):
        def edit(manifest):
            split = manifest["splits"]["train"]
            split["shards"] = [{**split["shards"][0], "name": name} for name in names]
            for key in ("documents", "tokens", "source_tokens"):
                split[key] *= len(names)
        return edit

    rows = len(_open(cfg, where).train)
    _edited(where, listing("train/000000", "train/000001"))  # each listed once, in order: a set of both
    assert len(_open(cfg, where).train) > rows
    for names, says in ((("train/000000", "train/000000"), "splits.train.shards[1] lists train/000000 again"),
                        (("train/000001", "train/000000"), "splits.train.shards[1] lists train/000000 after train/000001, out of the order"),
                        (("train/00001",), "shard 'train/00001' is not a shard of its split's folder (train/NNNNNN)")):
        (where / "manifest.json").write_text(original)
        _edited(where, listing(*names))
        with pytest.raises(DataError) as refused:
            _open(cfg, where)
        assert str(refused.value).startswith(f"data.prepared: {where}/manifest.json") and says in str(refused.value), str(refused.value)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(json.dumps({"model": {"family": "llama", "width": 32, "depth": 2, "heads": 2, "ffn": 64, "vocab": 512, "context": 16},
                                  "data": {"source": "text", "path": cfg.path, "val_fraction": 0.2, "tokenizer": {"bpe": 300}}}))
    (where / "manifest.json").write_text(original)
    _edited(where, listing("train/000000", "train/000000"))
    capsys.readouterr()
    assert main(["prepare", str(recipe), "--out", str(where), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{where}/manifest.json" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_set_whose_source_changed_or_whose_preparation_record_is_damaged_is_refused_naming_the_file(prepared, tmp_path, text_file):
    """A set is what it was made from: its source text changed since, `prepare` again refuses the set (and an unfinished
    preparation begun before the change) naming the file, where it once said the set was there already."""
    from blockforge.data.prepare import STARTED, Request, prepare
    from blockforge.errors import BlockforgeError

    where, cfg = prepared
    request = Request(cfg, Layout(pack=True, context=16))
    assert prepare(request, where, progress=False).reused
    text_file.write_text(text_file.read_text() + "\nOne sentence more.\n")
    with pytest.raises(BlockforgeError, match=f"^{where}: holds this data's set as prepared before {text_file} changed "
                                              r"\([\d,]+ bytes then, [\d,]+ now\); choose another --out, or remove the folder"):
        prepare(request, where, progress=False)
    manifest = json.loads((where / "manifest.json").read_text())
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / STARTED).write_text(json.dumps({"fingerprint": manifest["fingerprint"], "source": manifest["source"]}))
    with pytest.raises(BlockforgeError, match=f"^{unfinished}: holds an unfinished preparation of this data begun before {text_file} changed"):
        prepare(request, unfinished, progress=False)
    (unfinished / STARTED).write_text('{"fingerprint": ')
    with pytest.raises(BlockforgeError, match=f"^{unfinished}/{STARTED}: is damaged .* remove the folder to start over there"):
        prepare(request, unfinished, progress=False)


def test_a_set_of_two_files_one_changed_and_one_gone_or_unreadable_is_refused_naming_each(tmp_path, text_config, documents, capsys):
    """A set made from two named files: one edited and the other deleted (or unreadable), `prepare` names both and what to do,
    where it once took the set for this data's; with none of the files here (another machine) the set is used, said once."""
    from blockforge.data.prepare import Request, prepare
    from blockforge.errors import BlockforgeError

    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("\n\n".join(documents[:40]) + "\n")
    second.write_text("\n\n".join(documents[40:]) + "\n")
    request = Request(text_config(source="text", path=[str(first), str(second)]), Layout(pack=True, context=16))
    where = tmp_path / "set"
    prepare(request, where, progress=False)
    kept = first.read_text(), second.read_text()
    first.write_text(kept[0] + "\nOne sentence more.\n")
    second.unlink()
    with pytest.raises(BlockforgeError, match=rf"^{where}: holds this data's set as prepared before {first} changed \([\d,]+ bytes then, "
                                              rf"[\d,]+ now\) and {second} was deleted or moved \(restore it, or take it out of data.path\); "
                                              "choose another --out, or remove the folder"):
        prepare(request, where, progress=False)
    first.write_text(kept[0])
    second.mkdir()  # a path that cannot be read as a file, whoever runs this (root reads a file without permissions)
    with pytest.raises(BlockforgeError, match=rf"^{where}: holds this data's set as prepared before {second} became unreadable "
                                              r"\(Is a directory: make it readable, or take it out of data.path\)"):
        prepare(request, where, progress=False)
    second.rmdir()
    second.write_text(kept[1])
    assert prepare(request, where, progress=False).reused
    first.unlink()
    second.unlink()
    capsys.readouterr()
    assert prepare(request, where, progress=False).reused
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"none of the files its set was made from can be read here ({first} was deleted or moved)" in line, line


def test_a_damaged_source_record_is_one_sentence_naming_the_file_and_key(prepared, tmp_path):
    """The record of the source a set was made from, of the wrong types or missing keys, in manifest.json (read by `prepare`
    and by a run) or in preparing.json: one sentence naming the file and the key."""
    from blockforge.data.prepare import STARTED, Request, prepare
    from blockforge.errors import BlockforgeError

    where, cfg = prepared
    request = Request(cfg, Layout(pack=True, context=16))
    manifest = json.loads((where / "manifest.json").read_text())
    (entry,) = manifest["source"]["files"]
    cases = [("text", "source: is not a record of the builtin corpus or of files"), ({"files": "corpus.txt"}, "source.files: is not a list"),
             ({"files": [{"path": entry["path"]}]}, "source.files[0]: is not a file's path, bytes and sha256"),
             ({"files": [{**entry, "bytes": "12"}]}, "source.files[0].bytes: is not a whole number of bytes"),
             ({"files": [{**entry, "path": 3}]}, "source.files[0].path: is not text, or names a file named before"),
             ({"files": [entry, entry]}, "source.files[1].path: is not text, or names a file named before"),
             ({"files": [{**entry, "sha256": None}]}, "source.files[0].sha256: is not a sha256 in hex"),
             ({"builtin": 3}, "source.builtin: is not text")]
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    for source, says in cases:
        _edited(where, lambda m: m.update(source=source))
        with pytest.raises(BlockforgeError) as refused:
            prepare(request, where, progress=False)
        assert str(refused.value) == (f"{where}/manifest.json: is not the manifest of a prepared set ({says}); choose another --out, "
                                      "or remove the folder to prepare into it"), str(refused.value)
        with pytest.raises(DataError, match=rf"^data.prepared: {where}/manifest.json is not the manifest of a prepared set \({re.escape(says)}"):
            _open(cfg, where)
        (unfinished / STARTED).write_text(json.dumps({"fingerprint": manifest["fingerprint"], "source": source}))
        with pytest.raises(BlockforgeError, match=rf"^{unfinished}/{STARTED}: is damaged \({re.escape(says)}.*remove the folder to start over"):
            prepare(request, unfinished, progress=False)


def test_an_interrupted_preparation_publishes_nothing_and_a_rerun_continues_by_part(tmp_path, text_config, text_file, monkeypatch):
    from blockforge.data import prepare as prepare_module
    from blockforge.data.prepare import Request, prepare
    from blockforge.errors import WriteError

    cfg = text_config(source="text", path=str(text_file))
    monkeypatch.setattr(prepare_module, "PART_CHARS", 2000)
    real, runs, failed = prepare_module.run_part, [], []

    def failing(part, job, texts=None):
        runs.append(part.name)
        if len(runs) == 3 and not failed:
            failed.append(part.name)
            raise WriteError(f"{tmp_path / 'set'}: cannot write part {part.name} of the prepared set (No space left on device); free space")
        return real(part, job, texts)

    monkeypatch.setattr(prepare_module, "run_part", failing)
    with pytest.raises(WriteError, match="No space left on device"):
        prepare(Request(cfg, Layout(pack=True, context=16)), tmp_path / "set", progress=False)
    assert not (tmp_path / "set" / "manifest.json").exists() and len(list((tmp_path / "set" / "parts").glob("*.json"))) == 2
    runs.clear()
    outcome = prepare(Request(cfg, Layout(pack=True, context=16)), tmp_path / "set", progress=False)
    assert outcome.parts_resumed == 2 and len(runs) == outcome.parts_done and runs[0] not in ("train-000000", "train-000001")
    monkeypatch.setattr(prepare_module, "run_part", real)
    whole = prepare(Request(cfg, Layout(pack=True, context=16)), tmp_path / "whole", progress=False)
    assert outcome.manifest.splits == whole.manifest.splits  # the same shards, the same checksums
    assert not list((tmp_path / "set").glob(".staging-*"))


def test_a_full_disk_while_preparing_is_one_sentence_and_a_rerun_continues(tmp_path):
    """A file size limit stands in for a full disk: the write fails, `blockforge prepare` says so in one line, publishes
    nothing, and once there is room the same command finishes what is left."""
    import resource
    import subprocess
    import sys

    import yaml

    from tiny_data import tiny_recipe

    (tmp_path / "r.yaml").write_text(yaml.safe_dump(tiny_recipe(tmp_path, steps=10)))  # a training shard of ~70 kB
    command = [sys.executable, "-m", "blockforge", "prepare", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "set"), "--no-progress",
               "--workers", "1"]
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # noqa: E731 - the tokenizer fits, a shard does not
    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "cannot write" in done.stderr and "the preparation continues where it stopped" in done.stderr
    assert not (tmp_path / "set" / "manifest.json").exists()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and (tmp_path / "set" / "manifest.json").exists(), done.stderr


def test_two_preparations_of_one_folder_and_a_stream_that_ends_early_are_refused(tmp_path, text_config, text_file, jsonl_file):
    from blockforge.data.prepare import Request, prepare
    from blockforge.errors import FolderInUseError

    import subprocess
    import sys

    cfg = text_config(source="text", path=str(text_file))
    (tmp_path / "set").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from blockforge.lock import RunLock; "
                               "RunLock(sys.argv[1], 'prepare.lock', 'preparing a data set in it').acquire(); print('held', flush=True); "
                               "time.sleep(600)", str(tmp_path / "set")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUseError, match=f"^{tmp_path / 'set'}: is in use by process {holder.pid} on .* which is preparing a "
                                                   "data set in it; wait for it to end"):
            prepare(Request(cfg, Layout(pack=True, context=16)), tmp_path / "set", progress=False)
    finally:
        holder.kill()
        holder.wait()
    assert prepare(Request(cfg, Layout(pack=True, context=16)), tmp_path / "set", progress=False).parts_done == 2  # its holder gone
    stream = text_config(source="hf", dataset="json", path=str(jsonl_file), val_split=None, streaming=True)
    with pytest.raises(DataError, match=r"^data.dataset: the stream 'json' \(split 'train'\) ended after [\d,]+ tokens, [\d,]+ rows of "
                                        r"model.context 16 \([\d,]+ training tokens\), fewer than the 1,000,000 asked for; ask for at most"):
        prepare(Request(stream, Layout(pack=True, context=16), tokens=1_000_000), tmp_path / "stream", progress=False)
    assert not (tmp_path / "stream" / "manifest.json").exists()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    from blockforge.errors import BlockforgeError

    with pytest.raises(BlockforgeError, match=f"^{tmp_path / 'other'}: is not empty and holds no prepared set"):
        prepare(Request(cfg, Layout(pack=True, context=16)), tmp_path / "other", progress=False)


def test_prepare_flags_are_one_sentence(tmp_path, capsys):
    import yaml

    from tiny_data import tiny_recipe

    (tmp_path / "r.yaml").write_text(yaml.safe_dump(tiny_recipe(tmp_path)))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"base": "r.yaml", "space": {"model.layers.mix_ln.alpha": {"uniform": [0.0, 0.5]}}}))
    (tmp_path / "a-file").write_text("mine")
    recipe, out = str(tmp_path / "r.yaml"), str(tmp_path / "o")
    cases = [
        (["prepare", recipe], "--out: say where the prepared set goes"),
        (["prepare", recipe, "--out", out, "--tokens", "1M"], "--tokens: data.source text is finite"),
        (["prepare", str(tmp_path / "s.yaml"), "--out", out, "--tokens", "1M"], f"--tokens: every set {tmp_path / 's.yaml'} reads is finite"),
        (["prepare", recipe, "--out", out, "--tokens", "lots"], "'lots' is not a count of tokens"),
        (["prepare", recipe, "--out", out, "--tokens", "1e9999"], "1e9999 tokens is more than a set can hold; give at most 1e18"),
        (["prepare", recipe, "--out", out, "--tokens", "1e400"], "1e400 tokens is more than a set can hold"),
        (["prepare", recipe, "--out", str(tmp_path / "a-file")], f"--out {tmp_path / 'a-file'}: is a file, not a folder"),
        (["prepare", recipe, "--out", "/proc/self/x"], "--out /proc/self/x: cannot make a folder there"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()  # nothing made for a refused command


def test_where_rows_are_read_from_is_no_part_of_a_trials_identity(tmp_path):
    import yaml

    from blockforge.search.config import trial_identity
    from blockforge.spec import load_recipe
    from blockforge.spec.recipe import Assignment
    from tiny_data import tiny_recipe

    (tmp_path / "r.yaml").write_text(yaml.safe_dump(tiny_recipe(tmp_path)))
    plain = load_recipe(tmp_path / "r.yaml")
    for where in ("/data/sets/tiny", "s3://bucket/sets/tiny"):
        assert trial_identity(load_recipe(tmp_path / "r.yaml", [Assignment("data.prepared", where)])) == trial_identity(plain)
    assert trial_identity(load_recipe(tmp_path / "r.yaml", [Assignment("data.pack", False)])) != trial_identity(plain)


def test_the_last_part_of_a_stream_encodes_what_the_set_needs_and_the_set_does_not_depend_on_timing(tmp_path, text_config, documents,
                                                                                                       monkeypatch):
    """A stream of three files (three parts) prepared to a budget that needs a few documents of the third: that part stops
    at them. A part that started before the ones ahead of it ended (as with several workers) ran with a larger budget, and
    runs again when it is the last one used, so the set is the same set, byte for byte."""
    from blockforge.data import prepare as prepare_module
    from blockforge.data.prepare import Request, prepare

    for i in range(3):
        (tmp_path / f"s{i}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents[i * 27 : (i + 1) * 27]))
    cfg = text_config(source="hf", dataset="json", path=[str(tmp_path / f"s{i}.jsonl") for i in range(3)], val_split=None,
                      streaming=True, pack=False, bpe_train_chars=2000)
    request = Request(cfg, Layout(pack=False, context=16), tokens=16 * 45)  # 45 rows, one document each
    exact = prepare(request, tmp_path / "exact", progress=False)
    records = [json.loads((tmp_path / "exact" / "parts" / f"stream-{i:06d}.json").read_text()) for i in range(3)]
    before = sum(r["outputs"]["train"]["documents"] for r in records[:2])
    last = records[2]["outputs"]
    assert 0 < last["train"]["documents"] == 45 - before and last["train"]["documents"] + last.get("val", {}).get("documents", 0) < 15
    real, started = prepare_module._capped, set()

    def early(job, part, parts, records):  # a part's first start: none of the parts ahead of it had ended
        if part.name in started:
            return real(job, part, parts, records)
        started.add(part.name)
        return job

    monkeypatch.setattr(prepare_module, "_capped", early)
    again = prepare(request, tmp_path / "early", progress=False)
    assert again.manifest.splits == exact.manifest.splits and again.manifest.unigram_val_ppl == exact.manifest.unigram_val_ppl


def test_prepare_on_a_cluster_checks_every_node_first_naming_the_one_that_cannot_reach_the_storage_or_the_source(tmp_path, monkeypatch,
                                                                                                                 jsonl_file, text_config):
    """Nodes stood in by a list: one reaches no storage, or runs its tasks in a folder where a stream's relative path
    finds nothing. Each is one sentence naming that node, before any work; the line printed at the end names the
    search command with --address and --set."""
    import argparse
    import contextlib
    import os

    import ray

    from blockforge.cli import prepare as cli_prepare
    from blockforge.data.prepare import Request
    from blockforge.errors import BlockforgeError
    from blockforge.search import preflight
    from blockforge.spec.recipe import Assignment

    nodes = [{"Alive": True, "NodeID": f"{name * 16}", "NodeManagerAddress": f"10.0.0.{i}", "Resources": {"CPU": 2.0}}
             for i, name in enumerate("ab", 1)]
    (tmp_path / "elsewhere").mkdir()
    reaches = {"reason": "Access Denied", "missing": ["AWS_SECRET_ACCESS_KEY"]}

    def ask(asked, fn, *args):  # node 10.0.0.2 starts its tasks in a folder of its own
        for node in asked:
            with contextlib.chdir(tmp_path / "elsewhere" if node is nodes[1] else os.getcwd()):
                yield node, (reaches if node is nodes[1] else True) if fn is preflight._reaches else fn(*args)

    class Bucket(str):  # what the checks read of a Storage: its URI, its name
        uri = property(str)

    monkeypatch.setattr(preflight, "_ask_nodes", ask)
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr("blockforge.storage.Storage.open", Bucket)
    monkeypatch.chdir(tmp_path)
    request = Request(text_config(source="hf", dataset="json", path=jsonl_file.name, streaming=True, val_split=None),
                      Layout(pack=False, context=16), tokens=480)
    args = argparse.Namespace(out="s3://bucket/set", file="s.yaml", overrides=[Assignment("train.steps", 10)], address="auto")
    with pytest.raises(BlockforgeError, match=r"node 10\.0\.0\.2 \(id bbbbbbbbbbbb\) cannot reach the storage of --out \(Access Denied\), "
                                              "so no part could be written from there; that node lacks AWS_SECRET_ACCESS_KEY.* then prepare again"):
        cli_prepare._check_nodes(args, [request])
    reaches = True
    with pytest.raises(BlockforgeError, match=r"^data.path: node 10\.0\.0\.2 \(id bbbbbbbbbbbb\) does not read the files this process "
                                              r"reads \(data.path: 'corpus.jsonl' is not a file \(relative to .*elsewhere\)\), and the parts"):
        cli_prepare._check_nodes(args, [request])
    assert cli_prepare._search_command(args) == "blockforge search s.yaml --set train.steps=10 --out s3://bucket/set --address auto"


def test_training_on_a_prepared_set_reads_no_tokenizer_into_transformers_and_keeps_its_files(tmp_path):
    """Rows of a prepared set are ids: the run saves the set's tokenizer files as they are (checked against the manifest's
    fingerprint with `tokenizers` alone), and transformers is not imported; a tokenizer that is not the set's is refused."""
    import subprocess
    import sys

    from tiny_data import write_recipe

    recipe = write_recipe(tmp_path, steps=2, eval_every=0, checkpoint_every=0, grad_norm_every=0)
    from blockforge.cli import main

    assert main(["prepare", str(recipe), "--out", str(tmp_path / "set")]) == 0
    code = (f"import sys; from blockforge.spec import load_recipe; from blockforge.train.loop import Trainer; "
            f"r = load_recipe({str(recipe)!r}, [('data.prepared', {str(tmp_path / 'set')!r})]); "
            f"Trainer(r, {str(tmp_path / 'run')!r}, progress=False).run(); print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "run" / "tokenizer" / name).read_bytes() == (tmp_path / "set" / "tokenizer" / name).read_bytes()
    from blockforge.data.prepared import PreparedSet

    edited = tmp_path / "set" / "tokenizer" / "tokenizer.json"
    data = json.loads(edited.read_text())
    vocab = data["model"]["vocab"]  # two ids swapped: a tokenizer that reads, but makes other ids
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    edited.write_text(json.dumps(data))
    prepared = PreparedSet.open(tmp_path / "set")
    assert not prepared.tokenizer_is_the_sets()
    with pytest.raises(Exception, match="is not the tokenizer the set's ids were made with"):
        prepared.save_tokenizer(tmp_path / "elsewhere")

"""Data throughput on CPU: the in-loop streaming path against a prepared set, each figure against its floor, as ratios
measured in one run.

A C4-like local set is written first: JSON lines of 100-700 words each (sentences drawn from the builtin corpus, the
standard library's documentation), in several files (a stream's shards), read through `datasets` streaming as the
paper recipes read C4; a BPE of 8192; rows of 256 tokens, one document each (the paper's unpacked layout), batches
of 512 rows. Then, each figure per core from CPU time (torch and the tokenizer held to one thread), unless said
otherwise:

  1. reading: tokens of rows per second per core of the prepared set's reader (train_batches: the epoch order, the
     rows, the batch tensor), against a plain np.memmap reader of the same rows in the same order (MemmapRows, the
     floor any reader of these files has), on the main thread and in a thread of its own as the loop's feed reads;
     and the streaming path (reads JSON and tokenizes in the loop);
  2. preparation: tokens per second with 1 and 2 workers (wall clock; 2 workers as Ray tasks, measured last, so that
     Ray's threads share nothing else), and one worker's rate per core (its parts' process CPU time) against the
     tokenizer's raw batch rate on the same documents (its batch call alone, 256 documents a call);
  3. the shards' check: sha256 and the largest id of a set's shards, as a run does once per shard before reading it,
     in seconds per GB of shard;
  4. resume: the time to the first batch after a resume at data positions 0, 10^3, 10^6 and 10^8 of a set of
     --resume-rows rows (the epoch order read from the node's cache, as a run on the same node finds it, and drawn
     anew, as on another node; the shards' check, item 3, left out), and the streaming path's first batch after a
     resume at batch 0 and 60;
  5. the step never waits for data it could have had: a stand-in step of fixed length (a sleep, which leaves the
     CPU to the reader as a GPU step does) fed through the loop's feed, for the prepared and the streaming path.

Targets: the prepared reader >= 0.9x the memmap reader; preparation per core >= 0.9x the tokenizer's raw batch rate;
resume flat within 2x across positions and under 1 s; step time <= 1.05 x max(step, data).

    python benchmarks/data_throughput.py                 # about 2 minutes on two cores
    python benchmarks/data_throughput.py --documents 80000 --json runs/data-throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from itertools import islice
from pathlib import Path

import numpy as np

BATCH, CONTEXT, BPE = 512, 256, 8192
READ_BATCHES = 200  # batches each reader is timed on, a round


def write_c4_like(folder: Path, documents: int, files: int, seed: int = 0) -> list[str]:
    """JSON-lines files of documents of 100-700 words, made of the builtin corpus's sentences; their paths."""
    from blockforge.data.corpus import builtin_documents
    from blockforge.storage import cache_root

    texts, _ = builtin_documents(cache_root())
    sentences = [s.strip() + "." for text in texts for s in text.replace("\n", " ").split(". ") if len(s.split()) >= 4]
    rng = random.Random(seed)
    paths = [folder / f"c4-like-{i:02d}.jsonl" for i in range(files)]
    outs = [open(p, "w") for p in paths]
    for i in range(documents):
        words, parts = rng.randint(100, 700), []
        while sum(len(p.split()) for p in parts) < words:
            parts.append(rng.choice(sentences))
        outs[i % files].write(json.dumps({"text": " ".join(parts), "id": i}) + "\n")
    for out in outs:
        out.close()
    return [str(p) for p in paths]


def data_config(paths: list[str]):
    from blockforge.data import DataConfig, TokenizerConfig

    return DataConfig(source="hf", dataset="json", path=paths, val_split=None, streaming=True, pack=False,
                      tokenizer=TokenizerConfig(bpe=BPE), bpe_train_chars=20_000_000)


def per_batch(batches, count: int, clock=time.thread_time, thread: bool = False) -> float:
    """Seconds per batch over `count` batches (after one to warm up): the reading thread's CPU time (what reading costs a
    core, whatever else the process runs), or another clock; `thread`: read in a thread of its own, as the loop's feed
    reads (the main thread waits)."""
    if thread:
        import threading

        result = []
        reader = threading.Thread(target=lambda: result.append(per_batch(batches, count, clock)))
        reader.start()
        reader.join()
        return result[0]
    next(batches)
    started = clock()
    for _ in range(count):
        next(batches)
    return (clock() - started) / count


class MemmapRows:
    """The floor of reading: a split's document rows read straight from its shard files with np.memmap, in the fewest
    numpy steps (each row the document's first context + 1 ids, then pad ids)."""

    def __init__(self, folder: Path, split: dict, dtype: str, pad_id: int):
        self.tokens = [np.memmap(folder / f"{s['name']}.bin", dtype=dtype, mode="r") for s in split["shards"]]
        self.offsets = [np.memmap(folder / f"{s['name']}.idx", dtype=np.int64, mode="r") for s in split["shards"]]
        self.firsts = np.cumsum([0] + [s["documents"] for s in split["shards"]])
        self.pad_id, self.span = pad_id, np.arange(CONTEXT + 1)

    def rows(self, indices: np.ndarray) -> np.ndarray:
        out = np.empty((len(indices), CONTEXT + 1), dtype=np.int64)
        shard_of = np.searchsorted(self.firsts, indices, side="right") - 1
        for k in np.unique(shard_of):
            mine = shard_of == k
            local = indices[mine] - self.firsts[k]
            begin, end = self.offsets[k][local], self.offsets[k][local + 1]
            rows = self.tokens[k][np.minimum(begin[:, None] + self.span, end[:, None] - 1)]
            rows[self.span >= (end - begin)[:, None]] = self.pad_id
            out[mine] = rows
        return out


def measure_paths(cfg, prepared: Path, batches: int) -> dict:
    """Per batch, CPU time of the reading thread: the prepared reader and the memmap floor on the same rows in the same
    order (the median of three rounds, alternated), on the main thread and in a thread of their own; the streaming path."""
    import torch

    from blockforge.data.batching import shuffled_batches
    from blockforge.data.prepared import PreparedSet, PreparedTextDataset
    from blockforge.data.text import StreamingTextDataset
    from blockforge.storage import cache_root

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core: per-core figures
    stream = StreamingTextDataset(cfg, seq_len=CONTEXT, vocab=BPE, seed=0, cache_dir=cache_root())
    stream_s = per_batch(stream.train_batches(BATCH), batches)
    ready = PreparedTextDataset(PreparedSet.open(prepared), seq_len=CONTEXT, vocab=BPE, seed=0)
    manifest = json.loads((prepared / "manifest.json").read_text())
    floor = MemmapRows(prepared, manifest["splits"]["train"], manifest["dtype"], ready.tokenizer.pad_id)

    def floor_batches():
        for _, indices in shuffled_batches(len(ready.train), BATCH, 0):
            yield torch.from_numpy(floor.rows(indices))

    readers = {"prepared": lambda: ready.train_batches(BATCH), "memmap": floor_batches}
    assert all(torch.equal(a, b) for a, b in zip(islice(readers["prepared"](), 30), islice(readers["memmap"](), 30))), "different rows"
    times: dict[str, list[float]] = {}
    for _ in range(3):
        for name, batches_of in readers.items():
            times.setdefault(name, []).append(per_batch(batches_of(), READ_BATCHES))
            times.setdefault(f"{name}_thread", []).append(per_batch(batches_of(), READ_BATCHES, thread=True))
    s = {name: sorted(runs)[1] for name, runs in times.items()}
    tokens = BATCH * CONTEXT
    return {"streaming_cpu_s_per_batch": stream_s, "streaming_tokens_per_s": tokens / stream_s,
            **{f"{name}_cpu_s_per_batch": value for name, value in s.items()},
            "prepared_tokens_per_s": tokens / s["prepared"], "memmap_tokens_per_s": tokens / s["memmap"],
            "prepared_vs_memmap": s["memmap"] / s["prepared"], "prepared_vs_memmap_thread": s["memmap_thread"] / s["prepared_thread"],
            "prepared_vs_streaming": stream_s / s["prepared"], "runs": times}


def prepare_one_worker(cfg, folder: Path, tokens: int) -> tuple[dict, object, object]:
    """Prepare the stream to `tokens` with 1 worker (this process, one core), the tokenizer given (a BPE is trained once,
    before), and run the tokenizer's raw batch call alone on the same documents: three rounds, alternated (the machine's
    load hits both alike), the round of the median ratio kept. Returns (figures, request, tokenizer)."""
    from blockforge.data.prepare import InProcess, Request, _stream_training_texts, prepare
    from blockforge.data.prepared import Layout
    from blockforge.data.tokenizer import build_tokenizer
    from blockforge.storage import cache_root

    request = Request(cfg, Layout(pack=False, context=CONTEXT), BPE, tokens)
    tokenizer = build_tokenizer(cfg.tokenizer, _stream_training_texts(cfg), max_chars=cfg.bpe_train_chars, cache_dir=cache_root(), vocab=BPE)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    rounds, texts = [], None
    for i in range(3):
        target = folder / ("one" if i == 0 else f"one-{i}")
        started = time.perf_counter()
        prepare(request, target, workers=InProcess(), progress=False, tokenizer=tokenizer)
        one = _rates(target, time.perf_counter() - started)
        if texts is None:
            texts = list(islice(_stream_texts(cfg), sum(r["documents"] for r in one["parts"])))
        started = time.process_time()
        encoded = sum(len(ids) + 1 for i in range(0, len(texts), 256) for ids in tokenizer._encode_batch(texts[i : i + 256]))  # + its end id
        raw = encoded / (time.process_time() - started)
        rounds.append({"one_worker": one, "tokenizer_tokens_per_cpu_s": raw, "preparation_per_core_vs_tokenizer": one["tokens_per_cpu_s"] / raw})
        if i:
            shutil.rmtree(target)
    out = sorted(rounds, key=lambda r: r["preparation_per_core_vs_tokenizer"])[1]
    out["rounds_vs_tokenizer"] = [r["preparation_per_core_vs_tokenizer"] for r in rounds]
    return out, request, tokenizer


def prepare_two_workers(out: dict, request, tokenizer, folder: Path) -> dict:
    """The same preparation as two Ray tasks at once on a local Ray (last: Ray's threads stay in this process after)."""
    from blockforge.cluster import ensure_ray, stop_ray
    from blockforge.data.prepare import RayWorkers, prepare
    from blockforge.data.prepared import PreparedSet

    ensure_ray(None)
    try:
        workers = RayWorkers(2)
        warm = workers.ray.remote(num_cpus=1)(_import_preparation)
        workers.ray.get([warm.remote() for _ in range(2)])  # two worker processes started and importing before the clock
        started = time.perf_counter()
        prepare(request, folder / "two", workers=workers, progress=False, tokenizer=tokenizer)
        out["two_workers"] = _rates(folder / "two", time.perf_counter() - started)
    finally:
        stop_ray()
    one = PreparedSet.open(folder / "one")
    for split in ("train", "val"):  # the same rows (the last part's shard file may hold more where it started early)
        rows = [s.split(split, 0) for s in (one, PreparedSet.open(folder / "two"))]
        assert all(len(r) == len(rows[0]) for r in rows) and np.array_equal(*(r.rows(np.arange(len(r))) for r in rows)), \
            "1 and 2 workers prepared different sets"
    out["two_vs_one_worker"] = out["two_workers"]["tokens_per_s"] / out["one_worker"]["tokens_per_s"]
    return out


def _import_preparation() -> None:
    import blockforge.data.prepare  # noqa: F401


def _rates(folder: Path, wall: float) -> dict:
    """A preparation's rates from its parts' records: tokens encoded (documents whole) per second of wall clock, and per CPU
    second of the workers (each part's process CPU time)."""
    parts = []
    for path in sorted((folder / "parts").glob("*.json")):
        record = json.loads(path.read_text())
        parts.append({"part": record["part"], "documents": sum(o["documents"] for o in record["outputs"].values()),
                      "tokens": sum(o["source_tokens"] for o in record["outputs"].values()), "cpu_s": record["cpu_seconds"],
                      "s": record["seconds"]})
    encoded = sum(p["tokens"] for p in parts)
    return {"wall_s": wall, "tokens_encoded": encoded, "tokens_per_s": encoded / wall,
            "tokens_per_cpu_s": encoded / sum(p["cpu_s"] for p in parts), "parts": parts}


def _stream_texts(cfg):
    from blockforge.data.corpus import hf_texts, open_hf_split

    return hf_texts(open_hf_split(cfg, cfg.split, streaming=True), cfg)


def synthetic_set(folder: Path, rows: int, tokenizer_from: Path) -> Path:
    """A packed set of `rows` rows of random ids, written directly (for resume times at a large row count)."""
    from blockforge.data.prepared import FORMAT, MANIFEST, TOKENIZER, sha256_file

    folder.mkdir(parents=True)
    shutil.copytree(tokenizer_from / TOKENIZER, folder / TOKENIZER)
    manifest = json.loads((tokenizer_from / MANIFEST).read_text())
    tokens = rows * CONTEXT + 1
    rng = np.random.default_rng(0)
    splits = {}
    for split, count in (("train", tokens), ("val", 4 * CONTEXT + 1)):
        (folder / split).mkdir()
        bin_path, idx_path = folder / split / "000000.bin", folder / split / "000000.idx"
        with open(bin_path, "wb") as f:
            for start in range(0, count, 2**24):
                f.write(rng.integers(2, BPE, size=min(2**24, count - start), dtype=np.uint16).tobytes())
        idx_path.write_bytes(np.array([0, count], dtype=np.int64).tobytes())
        files = {kind: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for kind, p in (("bin", bin_path), ("idx", idx_path))}
        splits[split] = {"shards": [{"name": f"{split}/000000", "documents": 1, "tokens": count, "files": files}], "documents": 1,
                         "tokens": count, "source_tokens": count}
    manifest.update(format=FORMAT, layout={"pack": True, "context": CONTEXT}, splits=splits, requested_tokens=None, max_token_id=BPE - 1)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def first_batch_s(folder: Path, position: int) -> float:
    """Seconds from opening the set (as a resumed run does) to its first batch at data position `position` (in rows)."""
    from blockforge.data.prepared import PreparedSet, PreparedTextDataset

    started = time.perf_counter()
    data = PreparedTextDataset(PreparedSet.open(folder), seq_len=CONTEXT, vocab=BPE, seed=0)
    next(data.train_batches(BATCH, start=position // BATCH))
    return time.perf_counter() - started


def measure_check(folder: Path) -> dict:
    """What checking a set's shards costs a run (ShardCheck, once per shard before its first row is read): CPU and wall
    seconds per GB of shard files, the faster of two (the second reads from the page cache, as a set read before)."""
    from blockforge.data.prepared import PreparedSet

    prepared = PreparedSet.open(folder)
    shards = [shard for split in prepared.manifest.splits.values() for shard in split.shards]
    size = sum(expected["bytes"] for _, expected in prepared.manifest.files())
    cpu, wall = [], []
    for _ in range(2):
        check = PreparedSet(prepared.folder, prepared.manifest, str(folder)).check  # nothing checked yet
        started, started_cpu = time.perf_counter(), time.process_time()
        for shard in shards:
            check(shard)
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return {"gb": size / 1e9, "cpu_s_per_gb": min(cpu) / (size / 1e9), "wall_s_per_gb": min(wall) / (size / 1e9)}


def measure_resume(folder: Path, cfg) -> dict:
    """The first batch after a resume at several positions, the shards' check left out (measure_check times it)."""
    from blockforge.data import prepared as prepared_module
    from blockforge.data.batching import epoch_order
    from blockforge.data.text import StreamingTextDataset
    from blockforge.storage import cache_root

    positions = [0, 10**3, 10**6, 10**8]
    orders = cache_root() / "prepared" / "orders"
    drawn, saved = {p: [] for p in positions}, {p: [] for p in positions}
    check = prepared_module.ShardCheck._check
    prepared_module.ShardCheck._check = lambda self, shard: None
    try:
        for _ in range(3):  # each the median of three, rounds alternating over the positions
            for p in positions:
                shutil.rmtree(orders, ignore_errors=True)  # another node: the epoch's order is drawn (and kept)
                drawn[p].append(first_batch_s(folder, p))
                saved[p].append(first_batch_s(folder, p))  # this node again: the order it kept is read
    finally:
        prepared_module.ShardCheck._check = check
    drawn, saved = ({p: sorted(times)[1] for p, times in d.items()} for d in (drawn, saved))
    n = 51_200_000  # the paper's 1B: 100,000 steps of 512 documents
    started = time.perf_counter()
    epoch_order(n, 0, 0)
    paper_draw = time.perf_counter() - started
    stream = StreamingTextDataset(cfg, seq_len=CONTEXT, vocab=BPE, seed=0, cache_dir=cache_root())
    stream_first = {}
    for batch in (0, 60):
        started = time.process_time()
        next(stream.train_batches(BATCH, start=batch))
        stream_first[batch] = time.process_time() - started
    return {"positions": positions, "order_saved_s": saved, "order_drawn_s": drawn, "paper_1b_order_draw_s": paper_draw,
            "streaming_first_batch_cpu_s": stream_first}


def measure_overlap(cfg, prepared: Path, steps: int) -> dict:
    """Wall time per step of a stand-in step (a sleep) fed through the loop's Feed, against max(step, data)."""
    import torch

    from blockforge.data.prepared import PreparedSet, PreparedTextDataset
    from blockforge.data.text import StreamingTextDataset
    from blockforge.storage import cache_root
    from blockforge.train.feed import Feed

    out = {}
    ready = PreparedTextDataset(PreparedSet.open(prepared), seq_len=CONTEXT, vocab=BPE, seed=0)
    stream = StreamingTextDataset(cfg, seq_len=CONTEXT, vocab=BPE, seed=0, cache_dir=cache_root())
    for name, data, batch, step_s in (("prepared", ready, BATCH, 0.05), ("streaming", stream, 64, 0.05)):
        data_times, fed_times = [], []
        for _ in range(3):  # alternated, and the median of each: the machine's load hits both alike
            data_times.append(per_batch(data.train_batches(batch), steps, time.perf_counter, thread=True))  # the data alone, as the feed reads it
            feed = Feed(data.train_batches(batch), torch.device("cpu"))
            next(feed)
            started = time.perf_counter()
            for _ in range(steps):
                next(feed)
                time.sleep(step_s)
            fed_times.append((time.perf_counter() - started) / steps)
            feed.close()
        data_s, per_step = sorted(data_times)[1], sorted(fed_times)[1]
        out[name] = {"rows_per_batch": batch, "step_s": step_s, "data_s": data_s, "fed_step_s": per_step,
                     "serial_s": step_s + data_s, "vs_max": per_step / max(step_s, data_s), "data_runs_s": data_times,
                     "fed_runs_s": fed_times}
    return out


def report(results: dict) -> str:
    p, prep, c, r, o = results["paths"], results["preparation"], results["check"], results["resume"], results["overlap"]
    rows = [
        ("streaming path, tokens of rows/s per core", f"{p['streaming_tokens_per_s']:,.0f}", ""),
        ("memmap floor (MemmapRows), tokens of rows/s per core", f"{p['memmap_tokens_per_s']:,.0f}", ""),
        ("prepared set's reader, tokens of rows/s per core", f"{p['prepared_tokens_per_s']:,.0f}", ""),
        ("prepared / memmap floor, main thread / reading thread", f"{p['prepared_vs_memmap']:.2f}x / {p['prepared_vs_memmap_thread']:.2f}x",
         _target(min(p["prepared_vs_memmap"], p["prepared_vs_memmap_thread"]) >= 0.9, ">= 0.9x")),
        ("prepared / streaming", f"{p['prepared_vs_streaming']:,.0f}x", ""),
        ("preparation, 1 worker (tokens/s, wall)", f"{prep['one_worker']['tokens_per_s']:,.0f}", ""),
        ("preparation, 2 workers (tokens/s, wall)", f"{prep['two_workers']['tokens_per_s']:,.0f}", f"{prep['two_vs_one_worker']:.2f}x of 1"),
        ("tokenizer's raw batch rate, tokens/s per core", f"{prep['tokenizer_tokens_per_cpu_s']:,.0f}", ""),
        ("preparation per core / the tokenizer's raw batch rate", f"{prep['preparation_per_core_vs_tokenizer']:.2f}x",
         _target(prep["preparation_per_core_vs_tokenizer"] >= 0.9, ">= 0.9x")),
        (f"checking shards (sha256, largest id), s per GB ({c['gb']:.2f} GB; CPU / wall)",
         f"{c['cpu_s_per_gb']:.2f} / {c['wall_s_per_gb']:.2f}", "once per shard and run"),
    ]
    saved, drawn = r["order_saved_s"], r["order_drawn_s"]
    for pos in r["positions"]:
        rows.append((f"resume at position {pos:.0e}: first batch (order kept / drawn)", f"{saved[pos]:.3f} s / {drawn[pos]:.3f} s", ""))
    flat = max(saved.values()) / min(saved.values())
    flat_drawn = max(drawn.values()) / min(drawn.values())
    rows.append(("resume, slowest / fastest position (kept / drawn)", f"{flat:.2f}x / {flat_drawn:.2f}x",
                 _target(flat <= 2 and flat_drawn <= 2 and max(*saved.values(), *drawn.values()) < 1, "<= 2x, < 1 s")))
    rows.append(("drawing the paper 1B's epoch order (51.2M rows)", f"{r['paper_1b_order_draw_s']:.2f} s", "once per epoch and node"))
    stream_first = r["streaming_first_batch_cpu_s"]
    rows.append(("streaming path: first batch at batch 0 / 60 (CPU s)", f"{stream_first[0]:.2f} / {stream_first[60]:.2f}", ""))
    for name, row in o.items():
        rows.append((f"{name}: step {row['step_s'] * 1e3:.0f} ms, data {row['data_s'] * 1e3:.1f} ms per {row['rows_per_batch']} rows -> fed step",
                     f"{row['fed_step_s'] * 1e3:.1f} ms ({row['vs_max']:.3f} x max)", _target(row["vs_max"] <= 1.05, "<= 1.05")))
    width = max(len(a) for a, _, _ in rows)
    lines = [f"| {'measure':<{width}} | value | target |", f"| {'-' * width} | --- | --- |"]
    lines += [f"| {a:<{width}} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def _target(ok: bool, target: str) -> str:
    return f"{target}: {'met' if ok else 'NOT MET'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=20_000, help="documents of the C4-like set (the issue's: 80,000)")
    parser.add_argument("--files", type=int, default=8, help="files (a stream's shards) they are written into")
    parser.add_argument("--batches", type=int, default=3, help="streaming batches of 512 rows to time")
    parser.add_argument("--resume-rows", type=int, default=2**22, help="rows of the set resume is timed on")
    parser.add_argument("--steps", type=int, default=40, help="stand-in steps timed")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # per-core figures on a machine that may run other work
    work = Path(tempfile.mkdtemp(prefix="blockforge-data-bench-"))
    os.environ["BLOCKFORGE_CACHE"] = str(work / "cache")
    try:
        import datasets

        datasets.config.HF_DATASETS_CACHE = str(work / "hf")
        cfg = data_config(write_c4_like(work, args.documents, args.files))
        tokens = args.documents * 6 // 10 * CONTEXT  # 60% of the documents, one row each (the rest is held out or left)
        if (args.batches + 2) * BATCH * CONTEXT > tokens:
            parser.error(f"--documents {args.documents} is too few for --batches {args.batches} of {BATCH} rows")
        results = {"documents": args.documents, "files": args.files, "cpus": os.cpu_count()}
        print(f"C4-like set: {args.documents:,} documents in {args.files} files; preparing {tokens:,} training tokens", flush=True)
        preparation, request, tokenizer = prepare_one_worker(cfg, work, tokens)
        results["paths"] = measure_paths(cfg, work / "one", args.batches)
        print(json.dumps(results["paths"], indent=1), flush=True)
        big = synthetic_set(work / "big", args.resume_rows, work / "one")
        results["check"] = measure_check(big)
        print(json.dumps(results["check"], indent=1), flush=True)
        results["resume"] = measure_resume(big, cfg)
        print(json.dumps(results["resume"], indent=1, default=str), flush=True)
        results["overlap"] = measure_overlap(cfg, work / "one", args.steps)
        print(json.dumps(results["overlap"], indent=1), flush=True)
        results["preparation"] = prepare_two_workers(preparation, request, tokenizer, work)
        print(json.dumps(results["preparation"], indent=1), flush=True)
        print(report(results))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

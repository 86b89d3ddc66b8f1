"""Run by test_a_full_disk_stops_the_search_and_resume_continues_it, inside a mount namespace of its own
(`unshare -m`): a search writes into a small tmpfs that fills up while its first trial trains. The search
must stop at the first write that fails, in one sentence and a non-zero exit, and resume once the space is
freed. Prints one JSON line with what it saw."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from conftest import write_search  # noqa: E402


def blockforge(*args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "blockforge", *args], stdout=open(log / "stdout", "a"), stderr=open(log / "stderr", "w"),
                            env=dict(os.environ))


def main(folder: Path) -> None:
    disk = folder / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(disk)], check=True)
    path = write_search(folder, cells={"model.depth": [4]}, trials_per_cell=3, max_concurrent=1,
                        scheduler=None, overrides={"train.steps": 60, "train.checkpoint_every": 10})
    out = disk / "out"
    driver = blockforge("search", str(path), "--out", str(out), log=folder)
    deadline = time.monotonic() + 240
    while not list(out.glob("trials/*/*/checkpoints/step-*")):  # the first checkpoint: then fill the disk
        assert time.monotonic() < deadline and driver.poll() is None, "no checkpoint was written"
        time.sleep(0.1)
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    filled = time.monotonic()
    first = {"exit": driver.wait(timeout=120), "seconds": time.monotonic() - filled, "stderr": (folder / "stderr").read_text()}
    (disk / "filler").unlink()
    resumed = blockforge("search", str(path), "--out", str(out), "--resume", log=folder)
    second = {"exit": resumed.wait(timeout=300), "stderr": (folder / "stderr").read_text()}
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines() if line.strip()]
    latest = {}
    for r in records:
        latest[r["trial"]] = r
    print(json.dumps({"first": first, "second": second, "statuses": sorted(r["status"] for r in latest.values()),
                      "summary": (out / "summary.md").exists()}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

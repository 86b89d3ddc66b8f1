"""What two runs of one search must agree on: their reports, with what differs by nature (where the search is kept,
seconds, throughput) left out. Used to check that a search kept elsewhere (an object store, a cluster without a shared
disk) reports exactly what the same search in a local folder does."""

import json
from pathlib import Path


def comparable(folder: Path, location: str) -> dict[str, object]:
    """What a search's reports say, with what differs between two runs of it by nature left out: where the search is,
    seconds (results.csv's wall_s, summary.md's trial-seconds) and throughput (TensorBoard's *_per_s)."""
    out = {}
    summary = (folder / "summary.md").read_text().replace(location, "SEARCH")
    summary = summary.replace(" (Take the folder down first: optuna-dashboard and TensorBoard read local files; "
                              "`blockforge.open_search('SEARCH')` reads it where it is.)", "")
    lines, seconds = [], None  # seconds: the column of trial-seconds in the table being read
    for line in summary.splitlines():
        cells = line.split("|")
        if line.startswith("|") and "trial-seconds" in cells[-2:][0]:
            seconds = len(cells) - 2
        elif not line.startswith("|"):
            seconds = None
        if seconds is not None:
            line = "|".join(cells[:seconds] + cells[seconds + 1:])
        lines.append(line)
    out["summary.md"] = lines
    rows = [line.split(",") for line in (folder / "results.csv").read_text().splitlines()]
    wall = rows[0].index("wall_s")
    out["results.csv"] = [row[:wall] + row[wall + 1:] for row in rows]
    for name in ("alpha_law.json", "transfer.json", "pareto.json"):
        out[name] = json.loads((folder / name).read_text()) if (folder / name).exists() else None
    out["best"] = {p.name: p.read_text() for p in sorted((folder / "best").glob("*"))}
    out["tensorboard"] = tensorboard_scalars(folder / "tensorboard")
    return out


def tensorboard_scalars(root: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = {}
    for run in sorted(p for p in root.glob("*/*") if p.is_dir()):
        events = EventAccumulator(str(run))
        events.Reload()
        for tag in events.Tags()["scalars"]:
            if not tag.endswith("_per_s"):
                scalars[(run.relative_to(root).as_posix(), tag)] = [(e.step, e.value) for e in events.Scalars(tag)]
    return scalars



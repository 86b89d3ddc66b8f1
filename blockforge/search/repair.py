"""A search's ledger checked before it resumes: repaired from its copy and its run folders, or refused by name.

The ledger (trials.jsonl) is the search's truth and every record is written twice (trials.backup.jsonl). Before
`--resume`, a line that is not a record (but a last one a kill cut short), a ledger emptied or deleted, or a
trial whose record says it still runs while its run folder holds a result (its last line was lost to a kill)
are repaired: the records are merged from both copies, finished runs take their result from their folder, and
both copies are rewritten whole. What cannot be repaired (no copy to restore a damaged line from, run folders no
record names) is refused in one sentence, so a search is never resumed into a smaller answer.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from blockforge.errors import BlockforgeError
from blockforge.io import atomic_write_text
from blockforge.search.ledger import Ledger, TrialRecord, absolute_run_dirs, located, merged, read_lines, record_line, segment_files
from blockforge.train.events import Status


def _finished_in_folder(record: TrialRecord, metric: str) -> TrialRecord | None:
    """The finished record of a trial whose run folder holds result.json (completed or diverged), or None."""
    if not record.run_dir:
        return None
    try:
        result = json.loads((Path(record.run_dir) / "result.json").read_text())
    except (OSError, ValueError):
        return None
    status = result.get("status") if isinstance(result, dict) else None
    if status not in (Status.COMPLETED, Status.DIVERGED):
        return None
    metrics = {k: v for k, v in (result.get("metrics") or {}).items() if isinstance(v, (int, float))}
    value = metrics.get(metric) if status == Status.COMPLETED else None
    return replace(record, status=status, steps=int(result.get("step", record.steps)), metrics=metrics, value=value,
                   note="recorded again from its run folder (the ledger's line was lost)")


def repair_ledger(search_dir: Path, metric: str, resume: str) -> str | None:
    """Check and, where it can be done exactly, repair the ledger of `search_dir` before a resume; returns a sentence
    saying what was repaired (None: nothing needed it). Raises one BlockforgeError sentence when it cannot be."""
    path = search_dir / "trials.jsonl"
    ledger = Ledger(path)
    main, damaged = read_lines(path)
    copy, _ = read_lines(ledger.backup)
    segments = [record for part in segment_files(ledger.folder) for record in read_lines(part)[0]]
    moved = absolute_run_dirs(main) + absolute_run_dirs(copy)  # written before records named run folders relatively
    runs = sorted({str(p.parent) for p in (search_dir / "trials").glob("*/*/metrics.jsonl")})
    if damaged and not copy:
        raise BlockforgeError(f"{path}: line {damaged[0]} is not a record (the file was damaged) and there is no {ledger.backup.name} to restore "
                              f"it from, so finished trials could be missing; restore {path.name} from a copy, then resume with: {resume}")
    latest = {key: located(record, ledger.folder) for key, record in merged(main, copy, segments).items()}
    named = {str(Path(r.run_dir).resolve()) for r in latest.values() if r.run_dir}
    unnamed = [run for run in runs if str(Path(run).resolve()) not in named]
    if unnamed:
        which = "both copies of the ledger are empty or missing" if not latest else f"{len(unnamed)} run folder(s) are in no record"
        raise BlockforgeError(f"{path}: {which}, while {len(unnamed)} trial run folder(s) under {search_dir / 'trials'} hold runs (e.g. "
                              f"{Path(unnamed[0]).name}): the ledger lost them; restore {path.name} (or {ledger.backup.name}) from a copy, "
                              f"then resume with: {resume}")
    finished = {}
    for key, record in latest.items():
        done = _finished_in_folder(record, metric) if record.status in (Status.RUNNING, Status.INTERRUPTED) else None
        if done is not None:
            finished[key] = done
    in_main = merged(main)
    restored = [key for key, record in latest.items() if key not in in_main or in_main[key].seq < record.seq]
    if not (damaged or finished or restored or moved):
        return None
    top = max((r.seq for r in latest.values()), default=0)
    for record in finished.values():  # results read from run folders come after everything the ledger held
        top += 1
        latest[(record.cell, record.trial)] = replace(record, seq=top)
    text = b"".join(record_line(r, ledger.folder) for r in sorted(latest.values(), key=lambda r: r.seq)).decode()
    for target in (path, ledger.backup):
        atomic_write_text(target, text)
    for part in segment_files(ledger.folder):  # folded into both copies now
        part.unlink()
    Ledger.reopen(path)
    said = []
    if damaged:
        said.append(f"line(s) {', '.join(map(str, damaged[:5]))} were not records")
    if restored:
        said.append(f"{len(restored)} record(s) were restored from {ledger.backup.name}" + (" or the storage's record segments" if segments else ""))
    if moved:
        said.append(f"{moved} record(s) that named run folders by absolute paths now name them relative to the search folder")
    if finished:
        said.append(f"{len(finished)} finished trial(s) whose last line was lost were read back from their run folders")
    return f"{path}: repaired before resuming: " + "; ".join(said) + "."

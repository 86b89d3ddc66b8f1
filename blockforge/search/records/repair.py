"""A search's ledger checked before it resumes: repaired from its copy and its run folders, or refused by name.

The ledger (trials.jsonl) is the search's truth and every record is written twice (trials.backup.jsonl). Before
`--resume`, a line that is not a record (but a last one a kill cut short), a ledger emptied or deleted, or a
trial whose record says it still runs while its run folder holds a result (its last line was lost to a kill)
are repaired: the records are merged from both copies, finished runs take their result from their folder, and
both copies are rewritten whole. What cannot be repaired (no copy to restore a damaged line from, run folders no
record names) is refused in one sentence, so a search is never resumed into a smaller answer.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from blockforge.errors import BlockforgeError
from blockforge.io import atomic_write_json, atomic_write_text
from blockforge.search.records.ledger import Ledger, TrialRecord, absolute_run_dirs, located, merged, read_lines, record_line, segment_files
from blockforge.search.records.runs import finished_without_result, run_end
from blockforge.train.events import Status


def _finished_in_folder(record: TrialRecord, metric: str) -> TrialRecord | None:
    """The finished record of a trial whose run folder says it finished (completed or diverged), or None. A run whose
    result.json was cut short after its last step is read from its log and final checkpoint, and its result written again."""
    if not record.run_dir:
        return None
    end = run_end(record.run_dir, metric)
    if end is None:
        end = finished_without_result(record.run_dir, metric)
        if end is None:
            return None
        atomic_write_json(Path(record.run_dir) / "result.json", {"status": str(end.status), "step": end.step, "metrics": end.metrics,
                                                                   "message": "written again from the run's log and last checkpoint"})
    return replace(record, status=end.status, steps=end.step, metrics=end.metrics, value=end.value,
                   note="recorded again from its run folder (the ledger's line was lost)")


def _planned(plan, record: TrialRecord) -> bool:
    """Whether `record` names the trial this search's plan makes of its cell, values and seed (its own record)."""
    if plan is None or record.cell not in plan.all_names():
        return False
    from blockforge.search.config import trial_identity

    try:
        return trial_identity(plan.recipe(plan.seed_overrides(record.cell, dict(record.overrides), record.seed))) == record.identity
    except Exception:  # noqa: BLE001 (values no recipe takes: not this plan's)
        return False


def _against_runs(latest: dict, copies: dict[Path, list[TrialRecord]], metric: str, resume: str, plan=None) -> dict:
    """Records of trained trials checked against the runs they describe: one whose run folder this search does not hold is
    refused (naming the file and line it came from); one whose value is not its run's own last evaluation takes the run's.
    Returns the corrected records."""
    corrected = {}
    for key, record in latest.items():
        if record.status not in (Status.COMPLETED, Status.DIVERGED, Status.PRUNED) or not record.run_dir:
            continue
        if not (Path(record.run_dir) / "metrics.jsonl").exists():
            where = next(((path, i) for path, records in copies.items() for i, r in enumerate(records, 1)
                          if (r.cell, r.trial, r.seq) == (record.cell, record.trial, record.seq)), (None, 0))
            origin = f"{where[0]}: line {where[1]}" if where[0] else f"{record.cell} trial {record.trial}"
            run = Path(record.run_dir)
            if run.name == record.identity and _planned(plan, record):  # this search's own trial, whose folder went
                raise BlockforgeError(f"{origin}: records trial {record.trial} of cell {record.cell} as {record.status}, but its run folder "
                                      f"trials/{run.parent.name}/{run.name} is gone from the search (the storage lost it, or someone "
                                      "removed it), so what it found cannot be read back; restore the folder, or start the search "
                                      "afresh in another --out")
            raise BlockforgeError(f"{origin}: records trial {record.trial} of cell {record.cell} as {record.status}, but this search holds "
                                  f"no run of it ({Path(record.run_dir).name} has no metrics.jsonl): the record is not this search's; "
                                  f"remove the line from both copies, then resume with: {resume}")
        if record.status != Status.COMPLETED:
            continue
        end = run_end(record.run_dir, metric)
        if end is not None and end.status == Status.COMPLETED and end.step == record.steps and end.value != record.value:
            corrected[key] = replace(record, value=end.value, metrics=end.metrics,
                                     note=f"value read again from its run's own log ({record.value} in the ledger)")
    return corrected


def repair_ledger(search_dir: Path, metric: str, resume: str, plan=None) -> str | None:
    """Check and, where it can be done exactly, repair the ledger of `search_dir` before a resume; returns a sentence
    saying what was repaired (None: nothing needed it). Raises one BlockforgeError sentence when it cannot be. `plan`:
    the search's, to tell its own trials whose run folders were lost from records that are not its."""
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
    corrected = _against_runs(latest, {path: main, ledger.backup: copy}, metric, resume, plan)
    in_main = merged(main)
    restored = [key for key, record in latest.items() if key not in in_main or in_main[key].seq < record.seq]
    if not (damaged or finished or restored or moved or corrected):
        return None
    top = max((r.seq for r in latest.values()), default=0)
    for record in [*finished.values(), *corrected.values()]:  # what the run folders say comes after everything the ledger held
        top += 1
        latest[(record.cell, record.trial)] = replace(record, seq=top)
    text = b"".join(record_line(r, ledger.folder) for r in sorted(latest.values(), key=lambda r: r.seq)).decode()
    for target in (path, ledger.backup):
        atomic_write_text(target, text)
    for part in segment_files(ledger.folder):  # folded into both copies now
        part.unlink()
    said = []
    if damaged:
        said.append(f"line(s) {', '.join(map(str, damaged[:5]))} were not records")
    if restored:
        said.append(f"{len(restored)} record(s) were restored from {ledger.backup.name}" + (" or the storage's record segments" if segments else ""))
    if moved:
        said.append(f"{moved} record(s) that named run folders by absolute paths now name them relative to the search folder")
    if finished:
        said.append(f"{len(finished)} finished trial(s) whose last line was lost were read back from their run folders")
    if corrected:
        said.append(f"{len(corrected)} record(s) whose value was not their run's own last evaluation now hold the run's")
    return f"{path}: repaired before resuming: " + "; ".join(said) + "."

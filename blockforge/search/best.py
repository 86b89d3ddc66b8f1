"""Export the best trial of a search cell as a model; retrain it to the full budget first when needed."""

from __future__ import annotations

import json
from pathlib import Path

from blockforge.errors import BlockforgeError
from blockforge.search.config import load_search
from blockforge.search.ledger import Ledger, best_records
from blockforge.tables import fmt, markdown_table


def _pick_cell(cells: list[str], wanted: str | None, search_dir: Path) -> str:
    if wanted is None:
        if len(cells) == 1:
            return cells[0]
        raise BlockforgeError(f"{search_dir}: the search has {len(cells)} cells; choose one with --cell (one of: {'; '.join(cells)})")
    # Accept the cell's keys in any order, e.g. "width=64,depth=4".
    want = set(part.strip() for part in wanted.split(","))
    for cell in cells:
        if set(cell.split(",")) == want:
            return cell
    raise BlockforgeError(f"--cell {wanted}: no such cell in {search_dir}; choose one of: {'; '.join(cells)}")


def export_best(search_dir: str | Path, out: str | Path, *, cell: str | None = None, retrain: bool = False, progress: bool = True) -> Path:
    from blockforge.export import export_run
    from blockforge.train.loop import Trainer

    search_dir = Path(search_dir)
    marker = json.loads((search_dir / "search.json").read_text())
    plan = load_search(marker["file"])
    records = Ledger(search_dir / "trials.jsonl").records()
    name = _pick_cell(plan.cell_names(), cell, search_dir)
    best = best_records(records, plan.mode).get(name)
    if best is None:
        raise BlockforgeError(f"{search_dir}: cell {name} has no completed or pruned trial to export; resume the search first")
    run_dir = Path(best.run_dir)
    result_file = run_dir / "result.json"
    full = result_file.exists() and json.loads(result_file.read_text()).get("step") == plan.steps
    if retrain or not full:
        # A partial (pruned) best, or an explicit request: train the best spec to the full budget.
        recipe = plan.recipe(plan.trial_overrides(plan.cell(name), best.overrides))
        run_dir = search_dir / "retrain" / run_dir.name
        resume = (run_dir / "checkpoints" / "latest.json").exists() and not retrain
        if retrain and run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        Trainer(recipe, run_dir, resume=resume, progress=progress).run()
    mine = [r for r in records if r.cell == name]
    table = markdown_table(
        ["trial", "status", "alpha", "post-LN layers", "steps", plan.metric],
        [[r.trial, r.status, fmt(r.alpha), fmt(r.post_ln_layers), r.steps, fmt(r.value)] for r in mine],
    )
    note = f"retrained to the full {plan.steps} steps" if (retrain or not full) else f"trained {plan.steps} steps in the search"
    extra = f"""
## Search

Best trial {best.trial} of cell `{name}` in search `{plan.name}` ({note}); objective {plan.mode} {plan.metric}.

{table}
"""
    return export_run(run_dir, out, extra_card=extra)

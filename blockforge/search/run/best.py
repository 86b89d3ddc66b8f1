"""Export the best trial of a search cell as a model; retrain it to the full budget first when needed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from blockforge.errors import BlockforgeError
from blockforge.search.config import stored_plan
from blockforge.search.records.ledger import Ledger
from blockforge.spec.search import mode_sign
from blockforge.tables import fmt, markdown_table
from blockforge.train.events import Status


def pick_cell(cells: list[str], wanted: str | Mapping | None, search_dir, flag: str = "--cell") -> str:
    """The cell `wanted` names (its keys in any order), or the only one; else one sentence naming the cells."""
    if wanted is None:
        if len(cells) == 1:
            return cells[0]
        raise BlockforgeError(f"{search_dir}: the search has {len(cells)} cells; choose one with {flag} (one of: {'; '.join(cells)})")
    if isinstance(wanted, Mapping):  # {"depth": 8} from Python: the cell's name as its keys
        wanted = ",".join(f"{key}={value}" for key, value in wanted.items())
    if not isinstance(wanted, str):
        raise BlockforgeError(f"{flag} {wanted!r}: a cell is named by its keys, as a string such as {cells[0]!r} (or a dict of them); "
                              f"choose one of: {'; '.join(cells)}")
    # Accept the cell's keys in any order, e.g. "width=64,depth=4".
    want = set(part.strip() for part in wanted.split(","))
    for cell in cells:
        if set(cell.split(",")) == want:
            return cell
    raise BlockforgeError(f"{flag} {wanted}: no such cell in {search_dir}; choose one of: {'; '.join(cells)}")


def _front_choice(plan, evidence, name: str, pick: int | None, under: str | None):
    """The front point `pick` (numbered as summary.md lists them), or the best quality among front points within the
    budget `under` ('COST=X'), with its number: a search with a cost axis only."""
    from blockforge.search.evidence.pareto import front_evidence

    if not plan.costs:
        raise BlockforgeError("--pick and --under choose a point of a front; this search has no cost axis (objectives)")
    front = front_evidence(evidence.eligible, plan.costs, plan.mode)
    on = front.front()
    if not on:
        raise BlockforgeError(f"cell {name} has no front yet (no candidate with the confirmation's seeds); resume the search first")
    if pick is not None:
        if not 0 <= pick < len(on):
            raise BlockforgeError(f"--pick {pick}: cell {name}'s front has points 0..{len(on) - 1} (see summary.md)")
        return on[pick], pick
    cost, sep, text = under.partition("=")
    names = [c for c, _ in plan.costs]
    if not sep or cost not in names:
        raise BlockforgeError(f"--under {under}: give COST=X with a cost of this search ({', '.join(names)})")
    try:
        budget = float(text)
    except ValueError:
        raise BlockforgeError(f"--under {under}: {text!r} is not a number") from None
    mode = dict(plan.costs)[cost]
    within = [p for p in on if (p.costs[cost] <= budget if mode == "min" else p.costs[cost] >= budget)]
    if not within:
        cheapest = min(p.costs[cost] for p in on) if mode == "min" else max(p.costs[cost] for p in on)
        raise BlockforgeError(f"--under {under}: no front point of cell {name} is within it (the {'least' if mode == 'min' else 'most'} is {cheapest:g})")
    sign = mode_sign(plan.mode)
    best = min(within, key=lambda p: sign * p.candidate.mean)
    return best, on.index(best)


def _card_search_section(plan, evidence, name: str, chosen, point, number: int | None, seed: int, note: str, how: str) -> str:
    """What the card says of the search: which model these weights are (the cell's winner, or front point N with its
    costs), its replicates, and how it compares (with Pre-LN where the search compares placements), naming the method."""
    from blockforge.search.evidence.evidence import METHOD, describe, verdict

    if chosen is None:
        return f"No model of cell `{name}` reached the full budget in the search; these weights are its furthest pruned trial ({note})."
    if point is None:
        which = (f"The winner of cell `{name}` in search `{plan.name}` (objective {plan.mode} {plan.metric}): {describe(chosen)}, the best "
                 f"mean over its training seeds after confirmation, {chosen.spread()}.")
    else:
        costs = ", ".join(f"{cost} {value:,.6g}" for cost, value in point.costs.items())
        which = (f"Point {number} of cell `{name}`'s front in search `{plan.name}` ({how}): {describe(chosen)}, {plan.metric} "
                 f"{chosen.spread()}; its costs: {costs}.")
        if evidence.winner is not None and chosen is not evidence.winner:
            diff = evidence.difference_to(chosen, evidence.winner)
            which += (f" Against the cell's best mean ({describe(evidence.winner)}): {diff.text() if diff else 'no common seed'} "
                      f"({verdict(diff, plan.mode)}).")
    lines = [which, f"These weights are its seed-{seed} run ({note})."]
    if plan.against_pre_ln:
        if chosen is evidence.reference:
            lines.append("It is the cell's Pre-LN reference.")
        elif evidence.reference is None:
            lines.append("No Pre-LN model of the cell was trained to compare with.")
        else:
            diff = evidence.difference_to(chosen, evidence.reference)
            lines.append(f"Against Pre-LN: **{verdict(diff, plan.mode)}** ({diff.text() if diff else 'no common seed'}; {METHOD}).")
    return "\n\n".join(lines)


def export_best(
    search: str | Path, out: str | Path, *, cell: str | None = None, retrain: bool = False, progress: bool = True, format: str = "blockforge",
    pick: int | None = None, under: str | None = None, dtype: str | None = None, target: str | None = None,
) -> Path:
    """Export cell `cell`'s winner (the best mean over its replicates after confirmation, its base-seed run), or with a
    cost axis the front point `pick` or the best within `under`, in `format`. `search`: the search folder, or its URI
    (the records, then the chosen run, are taken down into a local copy first)."""
    from blockforge.search.records.store import SearchStore
    from blockforge.storage import Storage

    store = SearchStore(Storage.open(search), purpose="exports")
    store.pull_records()
    search_dir = store.local
    from blockforge.export import check_export_format, export_run
    from blockforge.search.evidence.evidence import describe, evidence_by_cell
    from blockforge.search.reports.candidates import candidate_table
    from blockforge.spec.serialize import load_spec
    from blockforge.train.loop import Trainer

    plan = stored_plan(search_dir)
    records = Ledger(search_dir / "trials.jsonl").records()
    name = pick_cell(plan.all_names(), cell, store)
    evidence = evidence_by_cell(plan, records)[name]
    point, number = (None, None) if pick is None and under is None else _front_choice(plan, evidence, name, pick, under)
    winner = evidence.winner if point is None else point.candidate
    if winner is not None:
        base = plan.settings[name].base_seed
        seed = base if base in winner.run_dirs else min(winner.run_dirs)
        searched, run_dir, full = winner.overrides, Path(winner.run_dirs[seed]), True
    else:  # nothing reached the full budget: the furthest, best pruned trial, retrained below
        sign = mode_sign(plan.mode)
        pruned = [r for r in records if r.cell == name and r.status == Status.PRUNED and r.value is not None]
        if not pruned:
            raise BlockforgeError(f"{store}: cell {name} has no completed or pruned trial to export; resume the search first")
        best = min(pruned, key=lambda r: (-r.steps, sign * r.value))
        seed, searched, run_dir, full = best.seed, best.overrides, Path(best.run_dir), False
    store.pull_whole_run(run_dir)
    check_export_format(format, load_spec(run_dir / "spec.yaml"), target)  # refused before any retraining
    if retrain or not full:
        # A partial (pruned) best, or an explicit request: train the best spec to the full budget, on the search's data.
        from blockforge.search.run.datasets import found_sets

        plan.prepared = found_sets(plan, store)
        recipe = plan.recipe(plan.seed_overrides(name, searched, seed), prepared=True)
        run_dir = search_dir / "retrain" / run_dir.name
        resume = (run_dir / "checkpoints" / "latest.json").exists() and not retrain
        if retrain and run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        Trainer(recipe, run_dir, resume=resume, progress=progress).run()
    note = f"retrained to the full {plan.settings[name].steps} steps" if (retrain or not full) else f"trained {plan.settings[name].steps} steps in the search"
    replicates = candidate_table(plan, evidence) if evidence.candidates else "(no replicate reached the full budget)"
    mine = [r for r in records if r.cell == name]
    alpha = ["alpha", "post-LN layers"] if plan.varies_alpha else []
    trials = markdown_table(
        ["trial", "stage", "status", "seed", *alpha, "model", "steps", plan.metric],
        [[r.trial, r.stage, r.status, r.seed, *([fmt(r.alpha), fmt(r.post_ln_layers)] if alpha else []), describe(r), r.steps, fmt(r.value)]
         for r in mine],
    )
    how = f"--pick {pick}" if pick is not None else f"the best quality on the front within {under}"
    extra = f"""
## Search

{_card_search_section(plan, evidence, name, winner if full else None, point, number, seed, note, how)}

The cell's answer: {evidence.claim()}

### Replicates

{replicates}

### Every trial of the cell

{trials}
"""
    return export_run(run_dir, out, extra_card=extra, format=format, dtype=dtype, target=target)

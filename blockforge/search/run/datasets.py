"""The data a search's trials read: each distinct set prepared once into the search's storage before the first trial.

Every trial a plan can train (each cell's probe points, transfer targets included) names its rows by its data
settings and row layout (data.prepared.set_key). Each distinct one is a prepared set in the search folder,
`data/<fingerprint>/`, taken as far as the plan's most-trained trial of it goes (its steps times batch times
context, with `confirm.length`'s longest continuation; a finite source is prepared whole). The driver prepares
what is missing as Ray tasks on the search's cluster (an interrupted preparation resumes by part), and every
trial and rank then reads the set: in place in a local folder, or from its node's one copy of a storage's. A
resumed search finds its sets there. A trial's identity does not change: where rows are read from is not part of
what it trains on. A recipe that names `data.prepared` itself is read from there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from blockforge.data.prepare import Request
from blockforge.data.prepared import recipe_layout, set_key

DATA = "data"  # the search folder's prepared sets


@dataclass(frozen=True)
class SearchSet:
    """One set the plan's trials read: what to prepare, where in the search folder, and which cells read it."""

    request: Request
    cells: tuple[str, ...]
    largest: str  # which trial trains on the most tokens of it: "CELL: STEPS steps x BATCH x CONTEXT"

    @property
    def rel(self) -> str:
        return f"{DATA}/{self.request.fingerprint}"


def trial_tokens(plan, name: str, recipe) -> int:
    """The training tokens of cell `name`'s longest trial of `recipe`: its steps (or the length check's longest
    continuation) times the batch times the context."""
    steps = max([recipe.train.steps, *plan.length_steps(name)])
    return steps * recipe.train.batch_size * recipe.spec.context


def search_sets(plan, tokens: int | None = None) -> list[SearchSet]:
    """Every set the plan's trials read and that they do not name themselves (`data.prepared`), in the plan's order;
    `tokens` replaces the plan's budget of a stream."""
    found: dict[str, dict] = {}
    for name, _, recipe in plan.trainable_recipes():
        if recipe.data.kind != "text" or recipe.data.prepared is not None:
            continue
        key = set_key(recipe.data, recipe_layout(recipe))
        entry = found.setdefault(key, {"recipe": recipe, "tokens": 0, "vocab": recipe.spec.vocab, "cells": [], "largest": name})
        tokens = trial_tokens(plan, name, recipe)
        if tokens > entry["tokens"]:
            steps = tokens // (recipe.train.batch_size * recipe.spec.context)
            entry["tokens"] = tokens
            entry["largest"] = f"{name}: {steps:,} steps x {recipe.train.batch_size} x {recipe.spec.context}"
        entry["vocab"] = min(entry["vocab"], recipe.spec.vocab)
        if name not in entry["cells"]:
            entry["cells"].append(name)
    sets = []
    for entry in found.values():
        recipe = entry["recipe"]
        request = Request(replace(recipe.data, prepared=None), recipe_layout(recipe), entry["vocab"])
        if request.streamed:
            request = replace(request, tokens=tokens or entry["tokens"])
        sets.append(SearchSet(request, tuple(entry["cells"]), entry["largest"]))
    return sets


def describe_sets(plan) -> list[str]:
    """A line per set the plan's trials read: what it holds and where the search prepares it (part of a compute plan)."""
    lines = []
    for entry in search_sets(plan):
        request, data = entry.request, entry.request.data
        source = {"builtin": "the builtin corpus", "text": "local text files", "hf": f"{data.dataset}"}[data.source]
        size = (f"{request.tokens:,} training tokens ({entry.largest})" if request.streamed else "the whole source")
        lines.append(f"data: {source}{', streamed' if request.streamed else ''}, {request.layout.name} rows of {request.layout.context}: "
                     f"{size}, prepared once into {entry.rel}/ before the first trial unless it is there "
                     f"(`blockforge prepare {plan.file} --plan` says what it costs)")
    return lines


def found_sets(plan, store) -> dict[str, str]:
    """The sets of the plan that the search's storage holds already: set_key -> where (for SearchPlan.prepared)."""
    from blockforge.data.prepare import set_prepared
    from blockforge.data.prepared import check_set

    where = {}
    for entry in search_sets(plan):
        storage = store.storage.child(entry.rel)
        if set_prepared(storage, entry.request):
            check_set(str(storage))  # whole, before the first trial reads it
            where[entry.request.key] = str(storage)
    return where


def prepare_search_sets(plan, store, *, progress: bool = True, should_stop=None) -> dict[str, str]:
    """Prepare every set the plan's trials read into the search's storage (as Ray tasks on the search's cluster, or in this
    process for a set of one part; those already there are kept); returns set_key -> where the set is, for
    SearchPlan.prepared."""
    from blockforge.data.prepare import InProcess, RayWorkers, part_count, prepare

    where = found_sets(plan, store)
    for entry in search_sets(plan):
        if entry.request.key in where:
            continue
        storage = store.storage.child(entry.rel)
        workers = RayWorkers() if part_count(entry.request) > 1 else InProcess()
        outcome = prepare(entry.request, str(storage), workers=workers, progress=progress, should_stop=should_stop,
                          say=lambda line: print(line, flush=True))
        if not outcome.reused:
            split = outcome.manifest.splits["train"]
            print(f"data: prepared {split.tokens:,} training tokens ({split.rows(outcome.manifest.layout):,} rows) for "
                  f"{', '.join(entry.cells)} into {storage} in {outcome.seconds:.1f} s ({outcome.parts_done} part(s) now, "
                  f"{outcome.parts_resumed} from before)", flush=True)
        where[entry.request.key] = str(storage)
    return where


def check_named_sets(plan) -> None:
    """Every set a trial's recipe names itself (`data.prepared`) is there, whole, and fits that recipe: one sentence before
    Ray starts, not a failure in each trial (its manifest and its files' sizes; nothing is taken down)."""
    from blockforge.data.prepared import check_matches, check_set

    seen = set()
    for _, _, recipe in plan.trainable_recipes():
        where = recipe.data.prepared
        layout = recipe_layout(recipe) if recipe.data.kind == "text" else None
        if where is None or (where, layout, recipe.spec.vocab) in seen:
            continue
        seen.add((where, layout, recipe.spec.vocab))
        check_matches(check_set(where), recipe.data, layout, recipe.spec.vocab, where)

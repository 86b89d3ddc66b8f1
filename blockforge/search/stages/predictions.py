"""The transfer targets' predictions, made once for all of them when every proxy cell is done, off the searcher's path.

A prediction fits the alpha laws and bootstraps them over seeds (up to a thousand resamples): work that must not
run inside Tune's `suggest`. The first target that finds the proxies done starts one background job for every
target; each target waits until the job is done, and then all of them queue their trials in the same round, as
they would have had the work been instant.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blockforge.search.stages.cell import SearchContext


class Predictions:
    def __init__(self, context: "SearchContext"):
        self.context = context
        self.results: dict | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict:  # Tune pickles the searcher: a running job is started again after a restore
        return {"context": self.context, "results": self.results, "error": None, "_thread": None}

    def ready(self) -> bool:
        """Start the job if it has not started; whether its predictions are there (a failure is raised here)."""
        if self.results is None and self._thread is None:
            records = self.context.proxy_records()
            self._thread = threading.Thread(target=self._predict, args=(records,), name="transfer-predictions", daemon=True)
            self._thread.start()
        if self.results is None and self._thread is not None:
            self._thread.join(timeout=0)
        if self.error is not None:
            raise self.error
        return self.results is not None

    def _predict(self, records: list) -> None:
        from blockforge.search.checks.transfer import predictions

        try:
            plan = self.context.plan
            self.results = predictions(plan, records, plan.target_names())
        except BaseException as err:  # handed to the searcher's thread by ready()
            self.error = err

    def of(self, target: str):
        return self.results[target]

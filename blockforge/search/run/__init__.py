"""A search running on Ray Tune: the driver, Tune's Searcher (searcher) and TrialScheduler (scheduler), the trainable
(trials), the prepared data before the first trial (datasets) and the export of a winner (best). Reached by module
(driver imports Ray when it runs); imports everything below it."""

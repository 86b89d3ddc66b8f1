"""Ray's own failures as one sentence: a trial killed by Ray's memory monitor (what the node had, what a trial used, what
to change), Tune's tracebacks of failed trials kept out of the terminal, and a local Ray whose start times out (tried
again, then one sentence naming Ray's logs)."""

import logging

import pytest

from blockforge import cluster
from blockforge.cluster import TrialFailures, failure_of, ray_failure, trial_failure
from blockforge.errors import BlockforgeError

# What Ray 2.60's OutOfMemoryError says (its message, shortened where it repeats itself)
OOM = """1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 10.0.0.7, ID: 78592e77066a) was 4.39GB used / 23.54GB limit (0.186301)
OOM kill reason: Memory usage 4709240832B exceeded threshold of 505523648B (2.0% of 25276182528B limit)
Ray killed 1 worker(s) based on the killing policy
Top 10 memory users: PID	MEM(GB)	COMMAND
13889	0.78	ray::ImplicitFunc.train
13927	0.76	ray::ImplicitFunc.train
13667	0.58	/usr/bin/python -m blockforge search searches/quickstart.yaml
Refer to the documentation on how to address the out of memory issue: https://docs.ray.io/en/latest/ray-observability/user-guides/debug-apps/debug-memory.html."""


def oom_error() -> BaseException:
    from ray.exceptions import OutOfMemoryError

    return OutOfMemoryError(OOM)


def test_a_memory_kill_says_the_node_what_it_had_what_a_trial_used_and_what_to_change():
    failure = trial_failure(oom_error())
    assert (failure.kind, failure.node, failure.used_gb, failure.limit_gb, failure.threshold, failure.trial_gb) == ("memory", "10.0.0.7", 4.39, 23.54, 0.02, 0.78)
    said = failure.sentence(needs_gib=0.5, at_once=2)
    assert said.startswith("killed by Ray's memory monitor on node 10.0.0.7: the node had 4.39 of 23.54 GB in use")
    assert "a trial's process used up to 0.78 GB (its memory plan: 512 MiB" in said and "2 trial(s) of the search running" in said
    assert "--max-concurrent" in said and "resources.cpu" in said and "\n" not in said
    assert ray_failure(RuntimeError("not Ray's")) is None and ray_failure(oom_error()).kind == "memory"


def test_tunes_traceback_of_a_failed_trial_is_kept_for_the_ledger_not_shown(capsys):
    logger = logging.getLogger(TrialFailures.LOGGER)
    shown = []

    class Catch(logging.Handler):
        def emit(self, record):
            shown.append(record.getMessage())

    handler = Catch()
    logger.addHandler(handler)
    try:
        with TrialFailures():
            for trial in ("run_trial_0bc5bc0d", "run_trial_1a2b3c4d"):
                logger.error(f"Trial task failed for trial {trial}", exc_info=oom_error())
            logging.getLogger("ray.tune.tune").error("Trials did not complete: [run_trial_0bc5bc0d]")
            logger.error("something else Tune says")
            assert failure_of("0bc5bc0d").kind == "memory" and failure_of("ffffffff") is None
        assert failure_of("0bc5bc0d") is None  # only while the search runs
    finally:
        logger.removeHandler(handler)
    assert shown == ["something else Tune says"]
    err = capsys.readouterr().err
    assert err.count("killed by Ray's memory monitor") == 1 and "Traceback" not in err  # said once, however many kills


def test_a_local_ray_that_does_not_start_in_time_is_tried_again_then_one_sentence(monkeypatch, capsys):
    import ray

    calls = []

    def slow_start(**settings):
        calls.append(settings)
        if len(calls) < 3:
            raise Exception("The current node timed out during startup. This could happen because some of the raylet failed to startup.")

    monkeypatch.setattr(cluster, "_init_ray", slow_start)
    monkeypatch.setattr(cluster, "START_PAUSE_S", 0.0)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    cluster._start_local(address="local")  # the third start succeeds: two lines said, no error
    assert len(calls) == 3 and capsys.readouterr().err.count("did not start within its 30 s") == 2

    calls.clear()
    monkeypatch.setattr(cluster, "_init_ray", lambda **settings: (_ for _ in ()).throw(Exception("The current node timed out during startup.")))
    with pytest.raises(BlockforgeError) as caught:
        cluster._start_local(address="local")
    said = str(caught.value)
    assert said.startswith("Ray's local node did not start within 30 s, 3 time(s) (load average") and "session_latest/logs" in said
    assert "too loaded" in said and "\n" not in said
    monkeypatch.setattr(cluster, "_init_ray", lambda **settings: (_ for _ in ()).throw(ValueError("bad object store size")))
    with pytest.raises(BlockforgeError, match=r"^Ray did not start \(bad object store size\); its logs are in"):
        cluster._start_local(address="local")

"""Trial processes kept warm across a search's stage barriers (search/run/slots.py), and a trial that takes the memory
plan its driver made instead of laying the model out again."""

import pytest


def test_the_slot_cache_keeps_each_slots_process_while_nothing_else_waits():
    from ray.tune.utils.object_cache import _ObjectCache

    from blockforge.search.run.slots import slot_cache_class

    cache = slot_cache_class(_ObjectCache, slots=2)(may_keep_one=True)
    assert cache.cache_object("cpu1", "a") and cache.cache_object("cpu1", "b")  # a barrier: no trial waits, both stay
    assert not cache.cache_object("cpu1", "c")  # beyond the slots: Ray's own rule (it keeps one at most)
    assert list(cache.flush_cached_objects()) == [] and cache.num_cached_objects == 2
    cache.increase_max("gpu1")  # a trial of another shape waits: only what Tune itself would keep stays
    assert list(cache.flush_cached_objects()) == ["a", "b"] and cache.num_cached_objects == 0
    cache.decrease_max("gpu1")
    assert cache.cache_object("cpu1", "d") and cache.pop_cached_object("cpu1") == "d"
    cache.cache_object("cpu1", "e")
    assert list(cache.flush_cached_objects(force_all=True)) == ["e"]  # the search's end: every one goes


def test_warm_slots_replaces_tunes_cache_only_inside_the_block():
    from ray.tune.execution import tune_controller
    from ray.tune.utils.object_cache import _ObjectCache

    from blockforge.search.run.slots import warm_slots

    with warm_slots(3) as warm:
        assert warm and type(tune_controller._ObjectCache(may_keep_one=True)).__name__ == "SlotCache"
    assert tune_controller._ObjectCache is _ObjectCache
    with warm_slots(1) as warm:  # one slot: Ray's own cache already keeps one
        assert not warm and tune_controller._ObjectCache is _ObjectCache


def test_a_trial_takes_a_started_worker_only_where_that_worker_holds_tunes_environment(monkeypatch):
    import os

    from ray.tune.execution import tune_controller

    from blockforge.search.run.slots import _class_cache, started_workers, started_workers_class

    _, base, defaults, copied = _class_cache()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    started = {**os.environ, **defaults}  # what Ray's processes inherited as it started

    class Trainable:
        pass

    class Other:
        pass

    cache = started_workers_class(base, started, defaults, copied)()
    assert "runtime_env" not in cache.get(Trainable)._default_options  # any started worker will do
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "set-since")  # Tune copies it into its trials; the started workers lack it
    assert cache.get(Other)._default_options["runtime_env"]["env_vars"]["AWS_ACCESS_KEY_ID"] == "set-since"  # Tune's own way
    monkeypatch.setattr("blockforge.cluster._started_env", None)  # a Ray joined or started elsewhere
    with started_workers() as taken:
        assert not taken and tune_controller._ActorClassCache is base
    monkeypatch.setattr("blockforge.cluster._started_env", started)
    with started_workers() as taken:
        assert taken and tune_controller._ActorClassCache.__name__ == "StartedWorkers"
    assert tune_controller._ActorClassCache is base


def test_a_trial_takes_its_drivers_memory_plan_and_one_too_large_is_one_sentence(monkeypatch):
    import torch

    from blockforge.errors import BlockforgeError
    from blockforge.train import memory
    from tiny_data import tiny_llama

    class Recipe:  # never laid out: the planned figure is all that is read
        spec = tiny_llama()

    monkeypatch.setattr(memory, "memory_plan", lambda *a, **k: pytest.fail("the plan was laid out again"))
    monkeypatch.setattr(memory, "machine_memory", lambda device: (8 * 2**30, "free on this machine"))
    memory.check_fits(Recipe, torch.device("cpu"), planned=2**30)
    with pytest.raises(BlockforgeError) as refused:
        memory.check_fits(Recipe, torch.device("cpu"), processes=2, planned=5 * 2**30)
    assert "needs about 10.0 GiB by the memory plan of its search cell's largest model" in str(refused.value)
    assert "\n" not in str(refused.value)

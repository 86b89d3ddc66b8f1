"""Trial processes kept warm across a search's stages.

With `reuse_actors=True` Ray Tune hands a finished trial's process (its actor) to the next trial that asks for the same
resources, but it keeps one only while a trial waits for it, plus one more. At a stage barrier (exploration's last trial
still running, confirmation not yet known) no trial waits, so every other slot's process ends, and the next stage starts
fresh ones: a new Python, torch, the model's first set-up, each time. A search has a fixed number of slots, and its next
trials ask for the same resources, so keeping one process per slot costs nothing it would not use again.

`warm_slots(n)` makes Tune's actor cache keep up to `n` idle processes per resource shape while no trial of another
shape waits (then it keeps only what Tune itself would, so a trial that needs other resources is never blocked), and
everything once the search ends. It replaces the cache class Tune's controller builds for the length of a fit; where Ray's
cache is not the one this was written against, it changes nothing.

`started_workers()` lets a search's first trials take the worker processes a local Ray starts with it (one per CPU,
Python and Ray already loaded, idle until the end otherwise). Tune gives every trial process a runtime environment of its
own (a few environment variables), and Ray starts a new process for any task whose environment differs from a worker's,
so those workers never run a trial. On the Ray this driver started, every worker inherited the driver's environment; when
it already holds each variable Tune would set, with Tune's value, the trial asks for no environment of its own and takes
a started worker: the same process, seconds sooner. Otherwise (a joined cluster, a variable set since) Tune's own way.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


def slot_cache_class(base: type, slots: int) -> type:
    """A subclass of Ray Tune's `_ObjectCache` (`base`) that keeps up to `slots` idle objects per key while nothing else waits."""

    class SlotCache(base):
        def _keep(self, key) -> int:
            others_wait = any(count > 0 for other, count in self._max_num_objects.items() if other != key)
            return max(self._max_num_objects[key], 0 if others_wait else slots)

        def cache_object(self, key, obj) -> bool:
            if len(self._cached_objects[key]) < self._keep(key):
                self._cached_objects[key].append(obj)
                self._num_cached_objects += 1
                return True
            return super().cache_object(key, obj)

        def flush_cached_objects(self, force_all: bool = False) -> Iterator:
            if force_all:
                yield from super().flush_cached_objects(force_all=True)
                return
            for key, objs in self._cached_objects.items():
                keep = self._keep(key)
                while len(objs) > keep:
                    self._num_cached_objects -= 1
                    yield objs.pop(0)

    return SlotCache


def _patchable() -> tuple[object, type] | None:
    """Tune's controller module and its cache class, when both are as this module expects."""
    try:
        from ray.tune.execution import tune_controller
        from ray.tune.utils.object_cache import _ObjectCache
    except ImportError:
        return None
    probe = _ObjectCache(may_keep_one=True)
    if getattr(tune_controller, "_ObjectCache", None) is not _ObjectCache or not all(
            hasattr(probe, name) for name in ("_cached_objects", "_max_num_objects", "_num_cached_objects")):
        return None
    return tune_controller, _ObjectCache


@contextlib.contextmanager
def warm_slots(slots: int) -> Iterator[bool]:
    """For the length of the block, Tune controllers built in it keep up to `slots` idle trial processes; yields whether
    it could (False: this Ray's cache is another, left as it is)."""
    found = _patchable() if slots > 1 else None
    if found is None:
        yield False
        return
    controller, base = found
    controller._ObjectCache = slot_cache_class(base, slots)
    try:
        yield True
    finally:
        controller._ObjectCache = base


def _class_cache() -> tuple[object, type, dict, tuple] | None:
    """Tune's controller module, its actor class cache and the variables Tune gives a trial process (its defaults, and
    the names it copies from this process's environment), when all are as this module expects."""
    try:
        from ray.tune.execution import class_cache, tune_controller
    except ImportError:
        return None
    base = getattr(class_cache, "_ActorClassCache", None)
    defaults, copied = getattr(class_cache, "DEFAULT_ENV_VARS", None), getattr(class_cache, "ENV_VARS_TO_PROPAGATE", None)
    if base is None or getattr(tune_controller, "_ActorClassCache", None) is not base or not isinstance(defaults, dict) or copied is None:
        return None
    if not isinstance(getattr(base(), "_cache", None), dict):
        return None
    return tune_controller, base, defaults, tuple(copied)


def trial_environment(defaults: dict, copied: tuple, environ) -> dict[str, str]:
    """The variables Tune sets in a trial process: its defaults, and those of `copied` that `environ` holds."""
    return {**defaults, **{name: environ[name] for name in copied if name in environ}}


def started_workers_class(base: type, started: dict[str, str], defaults: dict, copied: tuple) -> type:
    """A subclass of Tune's `_ActorClassCache` (`base`) whose trial class asks for no runtime environment while the
    processes Ray started (with environment `started`) already hold every variable Tune would give it."""
    import os

    import ray

    class StartedWorkers(base):
        def get(self, trainable_cls):
            wanted = trial_environment(defaults, copied, os.environ)
            if trainable_cls not in self._cache and all(started.get(name) == value for name, value in wanted.items()):
                self._cache[trainable_cls] = ray.remote(trainable_cls)
            return super().get(trainable_cls)

    return StartedWorkers


@contextlib.contextmanager
def started_workers() -> Iterator[bool]:
    """For the length of the block, Tune controllers built in it put trials in the workers of the local Ray this process
    started (see the module's docstring); yields whether they may (False: another Ray, or Tune's cache is another)."""
    from blockforge.cluster import started_environment

    started = started_environment()
    found = _class_cache() if started is not None else None
    if found is None:
        yield False
        return
    controller, base, defaults, copied = found
    controller._ActorClassCache = started_workers_class(base, started, defaults, copied)
    try:
        yield True
    finally:
        controller._ActorClassCache = base

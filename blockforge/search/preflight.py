"""What a search needs from the cluster, checked before its first trial.

Before Ray starts, every cell's candidate models (the base, each baseline, each searched value on its
own) are planned on the meta device (blockforge.train.memory: nothing is allocated), so a model too
large even to lay out is one sentence. Once connected, a trial's resources must fit one node of the
cluster, and its memory plan the memory of such a node (CPU trials) or of its GPUs (GPU trials, where
the driver can see them); otherwise Ray would wait for ever, or trials would fail one after another.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path
from typing import Any, Iterator

from blockforge.errors import BlockforgeError, SpecError
from blockforge.search.config import SearchPlan

GiB = 2**30


def _gib(n: float) -> str:
    return f"{n / GiB:,.1f} GiB"


def memory_needs(plan: SearchPlan) -> dict[str, int]:
    """Per cell, the largest memory plan of its candidate models: bytes per training process, on the device its trials
    train on (a CPU trial's activations in the CPU's dtype), as the trial's own check would plan it."""
    from blockforge.train.memory import memory_plan

    needs: dict[str, int] = {}
    planned: dict[str, int] = {}
    for name, probe, recipe in plan.trainable_recipes():
        train, resources = recipe.train, plan.resources_of(name)
        device_type = "cuda" if resources.gpu else "cpu"
        key = json.dumps([recipe.spec.arch_hash(), train.micro_batch, train.precision, train.parallel, device_type])
        if key not in planned:
            try:
                planned[key] = int(memory_plan(recipe, gpus=resources.data_parallel, sharded=train.parallel == "fsdp",
                                               device_type=device_type).total_per_gpu)
            except SpecError as err:
                what = f"cell {name}" + (f" with {json.dumps(probe)}" if probe else "")
                raise SpecError(f"{what}: {err.message}", file=plan.file) from None
        needs[name] = max(needs.get(name, 0), planned[key])
    return needs


def _describe(node: dict) -> str:
    res = node["Resources"]
    return f"{node.get('NodeManagerAddress', '?')}: {res.get('CPU', 0):g} CPU, {res.get('GPU', 0):g} GPU, {_gib(res.get('memory', 0))}"


def check_cluster(plan: SearchPlan, needs: dict[str, int], address: str | None, store=None) -> None:
    """Refuse, in one sentence, a search whose trials no node of the connected Ray cluster can run, or whose local
    search folder (`store`, a search/store.SearchStore) a node that can run them does not see."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    gpu_memory = _driver_gpu_memory(plan, nodes) if address is None or not address.startswith("ray://") else None
    check_nodes(plan, needs, nodes, gpu_memory)
    workers = [n for n in nodes if n["Resources"].get("CPU", 0) > 0 or n["Resources"].get("GPU", 0) > 0]
    if store is not None and not store.remote:
        check_shared_folder(store.local, workers)
    elif store is not None:
        check_storage_on_nodes(store.storage, workers)


SEEN_TIMEOUT_S = 60.0  # how long the per-node check of a local search folder may take (a node that must start a worker first)


def _ask_nodes(nodes: list[dict], fn, *args) -> Iterator[tuple[dict, Any]]:
    """(node, what `fn(*args)` returned there) for each node, one small task pinned to each; a node that does not answer
    within SEEN_TIMEOUT_S gives 'no answer (ERROR)'."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0)(fn)
    pending = {node["NodeID"]: remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(*args)
               for node in nodes}
    for node in nodes:
        try:
            yield node, ray.get(pending[node["NodeID"]], timeout=SEEN_TIMEOUT_S)
        except Exception as err:  # the node did not answer: it cannot be shown to do what is asked
            yield node, f"no answer ({type(err).__name__})"


def _named(node: dict) -> str:
    return f"node {node.get('NodeManagerAddress', '?')} (id {node['NodeID'][:12]})"


def check_shared_folder(folder: Path, nodes: list[dict], what: str = "this search folder",
                        writes: str = "its trials would write where the driver never reads") -> None:
    """Every node that can run a trial, other than the driver's own, must see the local search folder: a marker is
    written there and one small task per node reads it. A node that cannot is refused by name, before any trial."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    nodes = [node for node in nodes if node["NodeID"] != here]
    if not nodes:
        return
    token = uuid.uuid4().hex
    marker = Path(folder) / f".node-check-{token}"
    marker.write_text(token)
    try:
        for node, seen in _ask_nodes(nodes, _sees, str(marker), token):
            if seen is not True:
                raise BlockforgeError(
                    f"{folder}: {_named(node)} cannot see {what} ({seen}), and {writes}; put it on a "
                    "filesystem every node mounts (NFS), or in an object store: --out s3://BUCKET/PREFIX (or gs://...)")
    finally:
        marker.unlink(missing_ok=True)


# What a node's environment needs for a storage: the variables whose names start so (credentials, endpoints, regions).
STORAGE_VARIABLES = ("AWS_", "GOOGLE_", "GCS_", "GCE_", "CLOUDSDK_", "AZURE_", "AZURE_STORAGE_")


def check_storage_on_nodes(storage, nodes: list[dict], what: str = "the search's storage", runs: str = "no trial could run there",
                           again: str = "start the search again") -> None:
    """Every node that can run a trial (the driver's own too: a cluster's nodes keep the environment `ray start` had)
    writes, reads back and removes a probe object in the search's storage, one small task per node, before the first
    trial. A node that cannot is refused by name, with the storage variables this driver has and it lacks."""
    import os

    here = sorted(name for name in os.environ if name.startswith(STORAGE_VARIABLES))
    for node, found in _ask_nodes(nodes, _reaches, storage.uri, here):
        if found is True:
            continue
        if isinstance(found, str):
            found = {"reason": found, "missing": []}
        missing = found.get("missing") or []
        fix = (f"that node lacks {', '.join(missing)}, which this driver has: set them where that node's `ray start` runs "
               f"(its environment is its workers'), then {again}") if missing else \
            f"check that node's network, endpoint and credentials, then {again}"
        raise BlockforgeError(f"{storage}: {_named(node)} cannot reach {what} ({found.get('reason')}), so {runs}; {fix}")


def check_files_on_nodes(patterns, nodes: list[dict], key: str = "data.path",
                         why: str = "the parts of a stream read its files where they run") -> None:
    """Every node (the driver's own too: its workers may start elsewhere than this process) finds the files `patterns`
    name here, at the same sizes, as a task there would look for them. A node that does not is refused by name."""
    from blockforge.data.corpus import expand_paths

    expected = {path: os.path.getsize(path) for path in expand_paths(patterns)}
    for node, found in _ask_nodes(nodes, _finds, patterns, expected):
        if found is not True:
            raise BlockforgeError(f"{key}: {_named(node)} does not read the files this process reads ({found}), and {why}; put "
                                  "them on every node at the same absolute path, or on a filesystem every node mounts")


def _finds(patterns, expected: dict[str, int]):
    """Run on one node: True if the files `patterns` name there are `expected` (path -> size), else what differs."""
    import os

    from blockforge.data.corpus import expand_paths

    try:
        found = {path: os.path.getsize(path) for path in expand_paths(patterns)}
    except Exception as err:  # a DataError's sentence ("... matches no files (relative to ...)"), or the file system's
        return str(err).split("; ")[0]
    for path, size in expected.items():
        if path not in found:
            return f"{path} is not there"
        if found[path] != size:
            return f"{path} holds {found[path]:,} bytes there, {size:,} here"
    return True


def _reaches(uri: str, names: list[str]):
    """Run on one node: True if it writes, reads back and removes a probe object at `uri`; else why not, and which of the
    driver's storage variables (`names`) this node lacks."""
    import os

    from blockforge.storage import Storage

    try:
        Storage.open(uri).check()
        return True
    except Exception as err:  # a StorageError's reason, or what opening the storage said
        reason = getattr(err, "reason", "") or str(err).split(": ", 1)[-1].split(";")[0]
        return {"reason": reason, "missing": [name for name in names if name not in os.environ]}


def _sees(path: str, token: str):
    """Run on one node: True if it reads `token` at `path`, else what it found."""
    from pathlib import Path

    try:
        return True if Path(path).read_text() == token else "the marker written there reads differently"
    except FileNotFoundError:
        return "a marker the driver wrote there is missing on that node"
    except OSError as err:
        return err.strerror or str(err)


def check_nodes(plan: SearchPlan, needs: dict[str, int], nodes: list[dict], gpu_memory: int | None) -> None:
    """The checks of check_cluster on `nodes` (ray.nodes() entries) and the memory of one GPU, if known."""
    targets = set(plan.target_names())
    _check_nodes(plan, plan.resources, "resources", {n: v for n, v in needs.items() if n not in targets}, nodes, gpu_memory)
    if targets:
        where = "transfer.resources" if plan.transfer.resources else "resources"
        _check_nodes(plan, plan.transfer.resources or plan.resources, where, {n: v for n, v in needs.items() if n in targets}, nodes, gpu_memory)


def _check_nodes(plan: SearchPlan, res, where_set: str, needs: dict[str, int], nodes: list[dict], gpu_memory: int | None) -> None:
    fitting = [n for n in nodes if n["Resources"].get("CPU", 0) >= res.cpu and n["Resources"].get("GPU", 0) >= res.gpu]
    if not fitting:
        listing = "; ".join(_describe(n) for n in nodes) or "none alive"
        raise SpecError(f"a trial asks for {res.cpu:g} CPU and {res.gpu:g} GPU, but no node of the Ray cluster has that "
                        f"(nodes: {listing}); lower {where_set}.cpu / {where_set}.gpu, or add a node that has them", path=where_set, file=plan.file)
    if res.gpu == 0:
        room = max(n["Resources"].get("memory", 0) for n in fitting)
        where, processes = "memory of the largest node that fits the trial", res.data_parallel
    elif gpu_memory is not None:
        room, where, processes = gpu_memory, "memory of one GPU", 1
    else:
        return  # GPU memory unknown here: the trial itself will tell
    for name, need in needs.items():
        if need * processes > room:
            per = f" ({processes} processes)" if processes > 1 else ""
            raise SpecError(f"cell {name}: a trial needs about {_gib(need * processes)}{per} by its memory plan, more than the "
                            f"{_gib(room)} {where}; make the model or train.micro_batch_size smaller", file=plan.file)


def _driver_gpu_memory(plan: SearchPlan, nodes: list[dict]) -> int | None:
    """The smallest GPU of this machine, when it is a node that can run a GPU trial (else unknown)."""
    if plan.resources.gpu == 0:
        return None
    import ray
    import torch

    here = ray.get_runtime_context().get_node_id()
    if not any(n["NodeID"] == here and n["Resources"].get("GPU", 0) >= plan.resources.gpu for n in nodes):
        return None
    if not torch.cuda.is_available() or torch.cuda.device_count() < math.ceil(plan.resources.gpu):
        return None
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))

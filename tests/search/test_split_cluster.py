"""The split-cluster harness (split_cluster.py) does what later tests rely on: a worker node that sees every folder
but `hidden` as the driver does, a private `hidden` that dies with its node, env vars that reach its tasks, and a
clean stop."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .split_cluster import SplitCluster


def run_check(script: str, tmp_path: Path, timeout: int) -> dict:
    """Run one of the split-cluster scripts beside this file; its report is the last line it prints (Ray may print above it).
    It starts an S3 server of its own: the session's endpoint is not passed on (its port is taken while the session's
    server runs)."""
    env = {k: v for k, v in os.environ.items() if k not in ("BLOCKFORGE_TEST_S3_PORT", "AWS_ENDPOINT_URL")}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name(script)), str(tmp_path)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not SplitCluster.available(), reason="needs root on Linux and `unshare --mount`")
def test_worker_node_sees_its_own_empty_hidden_folder_and_a_replacement_starts_empty(tmp_path):
    # In a subprocess, so its Ray cluster does not meet the test session's Ray.
    report = run_check("split_cluster_check.py", tmp_path, timeout=300)

    first, again, second, third = report["first"], report["first_again"], report["second"], report["third"]
    # The worker does not see what the driver wrote under `hidden`, but sees what it wrote outside it ...
    assert first["hidden_files"] == [] and first["shared"] == "from the driver", first
    assert first["mnt_ns"] != report["driver_mnt_ns"]
    # ... and what the worker writes under `hidden` stays on its node, out of the driver's sight.
    assert again["hidden_files"] == ["worker.txt"] and again["node_id"] == first["node_id"]
    assert not report["driver_sees_worker_file"]
    assert all(seen["env"] == "a=b c" for seen in (first, second, third))  # env reaches the worker's tasks

    # Replaced mid-task: the old node is dead to the head, none of its processes survive, its task failed with it,
    # and the new node starts with an empty `hidden`.
    replaced = report["replaced"]
    assert replaced["new_id_differs"] and replaced["old_alive"] is False, replaced
    assert replaced["old_node_pids"] >= 3 and replaced["old_processes_left"] == {}, replaced
    assert replaced["busy_task"] == "NodeDiedError", replaced
    assert second["hidden_files"] == [] and second["node_id"] != first["node_id"], second

    # Killed outright (SIGKILL, no goodbye), the node is still declared dead, and nothing of it is left.
    killed = report["killed"]
    assert killed["old_alive"] is False and killed["old_node_pids"] >= 3 and killed["old_processes_left"] == {}, killed
    assert third["hidden_files"] == [] and report["alive_nodes"] == sorted([report["head_id"], third["node_id"]])

    # After the with-block nothing of the cluster runs, and the driver's side of `hidden` was never touched.
    assert report["left_running"] == [], report["left_running"]
    assert report["hidden_on_disk"] == ["driver.txt"]


@pytest.mark.slow
@pytest.mark.skipif(not SplitCluster.available(), reason="needs root on Linux and `unshare --mount`")
def test_a_search_on_nodes_that_share_no_disk_refuses_a_local_folder_and_in_object_storage_reports_as_a_local_one(tmp_path):
    # A head node (the driver, 0 CPUs) and a worker node whose view of the search folder is a private tmpfs.
    report = run_check("split_search_check.py", tmp_path, timeout=900)
    # A local --out the worker node does not see: refused before any trial, naming the node and the fix.
    assert report["refused"] is not None and "cannot see this search folder" in report["refused"] and "s3://" in report["refused"]
    assert report["left_in_refused_folder"] == []  # no search.json, no trials
    # In object storage the search that prunes, confirms and transfers reports exactly what the local folder's does.
    assert {"pruned", "completed"} <= set(report["statuses"]) and report["stages"] == ["confirm", "explore", "transfer"]
    assert report["reports_equal"], report.get("differ")
    # The worker node lost mid-trial: the trial is retried on the new node from the last checkpoint it put up.
    assert report["replaced_at"] is not None and report["replaced_statuses"] == ["completed", "completed"]
    first, again = report["attempts"]
    assert first["start_step"] == 0 and again["start_step"] >= report["replaced_at"][1] > 0
    assert again["node_id"] != first["node_id"]


@pytest.mark.slow
@pytest.mark.skipif(not SplitCluster.available(), reason="needs root on Linux and `unshare --mount`")
def test_the_faults_of_a_cluster_are_found_before_the_first_trial_and_resumes_run_where_the_search_ran(tmp_path):
    report = run_check("split_faults_check.py", tmp_path, timeout=1500)
    # A worker node without the storage's variables: refused before any trial, naming the node and what it lacks.
    refused = report["refused"]
    assert refused is not None and "cannot reach the search's storage" in refused and "AWS_ENDPOINT_URL" in refused, refused
    assert "s3fs" not in refused and report["written_when_refused"] == []
    # A second driver of the same search is refused naming the first.
    assert report["second"]["rc"] == 2 and "which is running this search" in report["second"]["stderr"][-1], report["second"]
    # SIGTERM: the resume line keeps --address; run as printed it continues the trial on the cluster from its checkpoint.
    assert report["first"]["rc"] == 143 and report["stopped_at"] is not None
    assert f"--address {report['resume_line'].split('--address ')[1].split()[0]}" in report["resume_line"]
    assert report["resumed"]["rc"] == 0, report["resumed"]
    first, *rest = report["attempts"]
    assert rest and all(a["node_id"] == report["worker"] for a in rest) and rest[-1]["start_step"] >= report["stopped_at"][1] > 0
    # ... and its TensorBoard holds each step once.
    assert report["tensorboard"]["files"] == 1 and report["tensorboard"]["steps"] == list(range(5, 401, 5)), report["tensorboard"]
    # The storage taken away: one sentence, no traceback.
    cut = report["cut"]
    assert cut["rc"] == 2 and len(cut["stderr"]) == 1 and "cannot be reached" in cut["stderr"][0], cut

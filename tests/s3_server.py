"""A local S3-compatible server for tests of searches kept in object storage: moto's server mode on 127.0.0.1,
reached through a proxy the tests can cut (storage that disappears mid-search) and bring back.

The endpoint (the proxy's port) and dummy credentials are put in the environment when this module is imported,
before any Ray starts, so every Ray worker of the test session inherits them; the server itself starts on first use.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_port() -> int:
    """A free port that nothing else of the session will take while the proxy is cut or not yet started: below the
    kernel's ephemeral range (where outgoing connections and `free_port` pick theirs) and above Ray's worker ports
    (10002-19999). A port from `free_port` is only free the moment it is read; a later connection may get it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    candidates = list(range(20000, ephemeral_low))
    random.Random(f"{os.getpid()}-{time.time_ns()}").shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


# One endpoint per test process and the commands it starts (they inherit it); each pytest-xdist worker its own, not the
# one its controller chose when it read this module.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
INHERITED = os.environ.get("BLOCKFORGE_TEST_S3_PORT") if os.environ.get("BLOCKFORGE_TEST_S3_WORKER") == WORKER else None
PROXY_PORT = int(INHERITED or quiet_port())
ENV = {
    "AWS_ENDPOINT_URL": f"http://127.0.0.1:{PROXY_PORT}",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "BLOCKFORGE_TEST_S3_PORT": str(PROXY_PORT),  # subprocesses (a CLI driver) keep the same endpoint
    "BLOCKFORGE_TEST_S3_WORKER": WORKER,
}
os.environ.update(ENV)


def wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:g} s")


def start_moto(port: int, auth_actions: int | None = None) -> subprocess.Popen:
    """moto's server on 127.0.0.1:`port`; with `auth_actions`, requests after the first that many are checked against
    its IAM users (keys, policies), so missing or read-only credentials are refused as S3 would refuse them."""
    env = dict(os.environ)
    if auth_actions is not None:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(auth_actions)
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
    except RuntimeError:
        server.kill()
        raise
    return server


class Proxy:
    """Forwards connections from 127.0.0.1:`port` to 127.0.0.1:`target`. `cut()` closes every connection and refuses new
    ones (the storage is gone); `restore()` accepts again."""

    def __init__(self, port: int, target: int):
        self.port, self.target = port, target
        self.listener: socket.socket | None = None
        self.links: list[socket.socket] = []
        self.lock = threading.Lock()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.close()
        with self.lock:
            links, self.links = self.links, []
        for link in links:
            try:
                link.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            link.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self.lock:
                self.links += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, target):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class S3:
    """The test session's server: moto behind the proxy at ENV's endpoint."""

    def __init__(self):
        self.server_port = quiet_port()
        self.server = start_moto(self.server_port)
        self.proxy = Proxy(PROXY_PORT, self.server_port)
        self.proxy.restore()
        self.buckets = 0

    def direct(self, bucket: str, prefix: str) -> str:
        """A URI of the server itself, past the proxy (pyarrow reads the endpoint from the URI): for tests that make many
        requests and cut nothing."""
        return f"s3://{bucket}/{prefix}?endpoint_override=127.0.0.1:{self.server_port}&scheme=http"

    def bucket(self, name: str | None = None) -> str:
        """A new, empty bucket; its name."""
        import boto3

        self.buckets += 1
        name = name or f"bucket-{self.buckets}"
        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.server_port}").create_bucket(Bucket=name)
        return name

    def close(self) -> None:
        self.proxy.cut()
        self.server.terminate()
        self.server.wait(timeout=10)


def authenticated_server() -> tuple[subprocess.Popen, int, dict[str, dict[str, str]]]:
    """A second moto server that checks credentials, with a bucket `guarded`, a user who may write there and one who
    may only read: (server, port, {"writer": env, "reader": env})."""
    import boto3

    port = quiet_port()
    server = start_moto(port, auth_actions=7)  # the set-up below, then every request is checked
    url = f"http://127.0.0.1:{port}"
    s3, iam = boto3.client("s3", endpoint_url=url), boto3.client("iam", endpoint_url=url)
    s3.create_bucket(Bucket="guarded")
    users = {}
    for user, actions in (("writer", "*"), ("reader", ["s3:Get*", "s3:List*"])):
        iam.create_user(UserName=user)
        key = iam.create_access_key(UserName=user)["AccessKey"]
        iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}))
        users[user] = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
    return server, port, users

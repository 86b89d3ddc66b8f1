import os
import warnings

# Before anything imports Ray (test modules do, when collected): a local Ray stays on 127.0.0.1, without token auth.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import pytest  # noqa: E402
import torch  # noqa: E402

# Tests pin the thread count: more threads than cores slows torch badly on small machines. Under pytest-xdist
# (`make test` runs two workers) the workers share the cores.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, min(2, (os.cpu_count() or 1) // WORKERS))
torch.set_num_threads(THREADS)
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))  # the commands the tests start (their own processes) too
warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.fixture(scope="session", autouse=True)
def blockforge_cache(tmp_path_factory):
    """One corpus/tokenizer/token cache for the session, apart from the user's; the variable is restored after."""
    saved = os.environ.get("BLOCKFORGE_CACHE")
    path = tmp_path_factory.mktemp("blockforge-cache")
    os.environ["BLOCKFORGE_CACHE"] = str(path)
    yield path
    if saved is None:
        os.environ.pop("BLOCKFORGE_CACHE", None)
    else:
        os.environ["BLOCKFORGE_CACHE"] = saved


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)

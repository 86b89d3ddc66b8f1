import os
import warnings

import pytest
import torch

# Tests pin the thread count: more threads than cores slows torch badly on small machines.
torch.set_num_threads(min(2, os.cpu_count() or 1))
warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)

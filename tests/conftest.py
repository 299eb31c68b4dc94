import os

import pytest

os.environ.setdefault("DEPLOY_DEBUG", "1")  # verifier after every pass in tests


def pytest_collection_modifyitems(config, items):
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")
        has_gpu = True
    except OSError:
        has_gpu = False
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (libcuda)")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip)

# The generated kernels use OpenMP. Tests run several compiles side by side (pytest-xdist), so
# kernels default to one thread here; tests/test_threads.py runs with two on purpose.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Hermetic tuning database: tests never read or write the user's ~/.cache/deploy records.
import tempfile

os.environ.setdefault("DEPLOY_TUNING_DB",
                      os.path.join(tempfile.mkdtemp(prefix="deploy-test-db-"), "tuning.jsonl"))

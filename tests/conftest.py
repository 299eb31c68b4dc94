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

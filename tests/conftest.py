"""Test tiers: tier (a) runs anywhere; tests marked ``gpu`` need a GPU and
skip with the reason when there is none, except under PYAR_REQUIRE_GPU=1 (the
GPU runner), where a missing GPU is a failure: on the device nothing skips."""
import os
import subprocess
import sys

import pytest

REQUIRE_GPU = os.environ.get("PYAR_REQUIRE_GPU") == "1"


def _gpu_status():
    # In a subprocess: a broken driver must not take the test process down.
    probe = ("import pyar._hip as h\n"
             "try:\n    print(h.get_device_count())\n"
             "except Exception as e:\n    print(0, type(e).__name__, e)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120)
    words = (result.stdout or "0 no output: " + result.stderr).split(maxsplit=1)
    count = int(words[0]) if words[0].isdigit() else 0
    return count, (words[1].strip() if len(words) > 1 else "")


_status = None


def gpu_count():
    global _status
    if _status is None:
        _status = _gpu_status()
    return _status[0]


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or gpu_count() > 0:
        return
    reason = f"no GPU visible to pyar ({_status[1] or 'zero devices'})"
    if REQUIRE_GPU:
        raise pytest.UsageError(f"PYAR_REQUIRE_GPU=1 but {reason}")
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def driver(tmp_path_factory):
    """The kernels' host build under ThreadSanitizer (tests/protocol_host.py), built once
    for the host-build test modules."""
    from tests.protocol_host import build_driver
    return build_driver(tmp_path_factory.mktemp("protocol_host"))

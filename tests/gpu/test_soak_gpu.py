"""The soak scenario (tests/mpi/soak.py) at 4 ranks on GPU 0 under MPS: every
kind of call in random order for $PYAR_SOAK_SECONDS (default 20 s; 600 for
the long run), 0 wrong results, and the GPU's free memory, open descriptors
and resident memory flat between the end of the warm-up and the end."""
import os

import pytest

from tests.gpu.scenarios import rows_of, scenario

pytestmark = pytest.mark.gpu

WORLD = 4


def test_soak():
    seconds = float(os.environ.get("PYAR_SOAK_SECONDS", "20"))
    row = rows_of(scenario("soak", WORLD, timeout=int(seconds) + 360,
                           env={"PYAR_SOAK_SECONDS": str(seconds),
                                "PYAR_POOL_RELEASE_THRESHOLD": "0"}), "soak")[0]
    assert row["wrong"] == 0 and row["failed_checks"] == 0, row
    assert row["seconds"] >= seconds and row["calls"] >= seconds, row  # not stuck
    kinds = row["by_kind"]
    assert {"eager-staged", "eager-registered", "fused-staged", "fused-registered",
            "graph-allreduce", "graph-fused"} <= set(kinds), row
    tolerance = row["tolerance"]
    assert row["device_mib"] <= tolerance["device_mib"], row
    assert row["fds"] <= tolerance["fds"], row
    assert row["rss_mib"] <= tolerance["rss_mib"], row

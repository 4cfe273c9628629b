"""Running the MPI scenarios of tests/mpi from GPU tests, and reading their rows."""
from tests.mpi_launch import run_scenario

WATCHDOG_MARGIN = 30  # a hung rank dumps its stack this long before mpirun is killed


def scenario(name, world, *args, timeout=300, env=None):
    """Run a scenario; returns its summary rows (all from rank 0)."""
    env = dict(env or {}, PYAR_SCENARIO_WATCHDOG=str(timeout - WATCHDOG_MARGIN))
    _, rows = run_scenario(name, world, *args, timeout=timeout, env=env)
    assert rows, f"{name} on {world} ranks reported nothing"
    for row in rows:
        assert row["world"] == world, row
    return rows


def rows_of(rows, test):
    found = [r for r in rows if r["test"] == test]
    assert found, f"no {test!r} rows in {rows}"
    return found

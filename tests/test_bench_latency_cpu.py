"""pyar.bench --latency without a GPU: the row arithmetic (ratios, the
issue's target, the best LL), the LL one-shot and two-shot left blank above
their limits, the cells, the command line, and the sweep's order of calls on
stand-in arrays and streams."""
import types

import numpy as np
import pytest

pytest.importorskip("mpi4py")

from pyar.bench import exact, latency  # noqa: E402
from pyar.bench import __main__ as bench  # noqa: E402
from pyar.comm import algorithms  # noqa: E402


def _cells(row):
    line = latency.table().row(latency.cells(row))
    return [c.strip() for c in line.split("|")[1:-1]]


@pytest.mark.parametrize("ll, oneshot, floor, target", [
    (6.0, 10.0, 4.0, True),     # 0.6x one-shot exactly
    (6.1, 10.0, 4.0, False),    # above both bounds
    (4.8, 5.0, 4.0, True),      # 1.2x the floor exactly, above 0.6x one-shot
    (4.9, 5.0, 4.0, False),
])
def test_target_takes_the_larger_bound(ll, oneshot, floor, target):
    row = latency.row(4096, 2048, "bfloat16", "graph",
                      {"oneshot": oneshot, "twoshot": 12.0, "ll": ll}, floor)
    assert row["target"] is target
    assert row["ll_vs_oneshot"] == pytest.approx(ll / oneshot)
    assert row["ll_vs_floor"] == pytest.approx(ll / floor)


def test_row_without_ll_has_no_ratios_or_target():
    row = latency.row(1 << 20, 1 << 19, "bfloat16", "eager",
                      {"oneshot": 30.0, "twoshot": 20.0}, 3.0, wrong=0)
    assert row["ll_us"] is None and row["ll2_us"] is None and row["target"] is None
    assert row["ll_vs_oneshot"] is None and row["ll_vs_floor"] is None
    assert row["best_vs_oneshot"] is None
    assert _cells(row) == ["1 MiB", "524288", "bfloat16", "eager", "30.00", "20.00", "-",
                           "-", "3.00", "-", "-", "-", "-", "-", "-", "0"]


def test_cells_follow_the_columns():
    row = latency.row(1024, 256, "float32", "graph",
                      {"oneshot": 10.0, "twoshot": 14.5, "ll": 5.0, "ll_twoshot": 7.0}, 4.0)
    cells = latency.cells(row)
    assert len(cells) == len(latency.COLUMNS)
    assert _cells(row) == ["1 KiB", "256", "float32", "graph", "10.00", "14.50", "5.00",
                           "7.00", "4.00", "-", "0.50x", "1.25x", "-", "yes", "0.50x", "-"]
    assert _cells(dict(row, ll_us=9.0, target=False))[13] == "no"
    assert {name for name, _ in latency.COLUMNS} - {"size", "type"} <= set(row)


def test_signal_floor_column_and_ratio():
    row = latency.row(1024, 256, "float32", "graph", {"oneshot": 10.0, "ll": 5.0}, 1.5,
                      signal_us=4.0)
    assert row["signal_us"] == 4.0 and row["ll_vs_signal"] == pytest.approx(1.25)
    assert row["target"] is True   # the target's bounds stay the one-shot and the floor
    cells = _cells(row)
    assert cells[9] == "4.00" and cells[12] == "1.25x"


def test_signal_floor_is_a_latency_option(capsys):
    assert bench.parse_args(["--latency", "--signal-floor"]).signal_floor
    assert not bench.parse_args(["--latency"]).signal_floor
    with pytest.raises(SystemExit) as raised:
        bench.parse_args(["--signal-floor"])
    assert raised.value.code == 2
    assert "--signal-floor is a column of --latency" in capsys.readouterr().err


@pytest.mark.parametrize("times, best", [
    ({"ll": 5.0, "ll_twoshot": 4.0}, 0.4),   # the two-shot the faster
    ({"ll": 5.0, "ll_twoshot": 6.0}, 0.5),
    ({"ll_twoshot": 7.0}, 0.7),              # above the one-shot LL's limit
])
def test_best_ll_is_the_faster_that_takes_the_size(times, best):
    row = latency.row(1 << 19, 1 << 17, "float32", "eager", {"oneshot": 10.0, **times}, 3.0)
    assert row["best_vs_oneshot"] == pytest.approx(best)
    assert row["ll2_us"] == pytest.approx(times["ll_twoshot"])
    assert (row["target"] is None) is ("ll" not in times)


def test_ll_takes_sizes_up_to_its_segment():
    limit = algorithms.LL_MAX_BYTES
    big = 64 << 20
    assert latency.takes("ll", limit, big, 8) and not latency.takes("ll", limit + 1, big, 8)
    assert not latency.takes("ll", 64 << 10, 32 << 10, 2)   # max_size below LL_MAX_BYTES
    assert latency.takes("oneshot", big, big, 2)


@pytest.mark.parametrize("world, largest", [
    (2, 256 << 10), (3, 384 << 10), (4, 512 << 10), (8, 1 << 20)])
def test_ll_twoshot_takes_world_halves_of_a_segment(world, largest):
    big = 64 << 20
    assert latency.takes("ll_twoshot", largest, big, world)
    assert not latency.takes("ll_twoshot", largest + 1, big, world)
    # max_size 32 KiB: world halves of a 32 KiB segment
    assert latency.takes("ll_twoshot", world * (16 << 10), 32 << 10, world)
    assert not latency.takes("ll_twoshot", world * (16 << 10) + 1, 32 << 10, world)


def test_latency_command_line():
    args = bench.parse_args(["--latency", "-b", "1K", "-e", "1M"])
    assert args.latency and bench.point_count(args) == 2 * 11   # eager + graph, 11 sizes
    assert not bench.parse_args([]).latency


@pytest.mark.parametrize("extra", [["--fused"], ["--node-size", "2"], ["--staged"],
                                   ["--graph"], ["--plot", "x.png"]])
def test_latency_refuses_other_modes(extra, capsys):
    with pytest.raises(SystemExit) as raised:
        bench.parse_args(["--latency"] + extra)
    assert raised.value.code == 2
    assert "--latency times its own" in capsys.readouterr().err


class HostArray:
    """Host memory standing in for a device array."""

    def __init__(self, host):
        self.host, self.size, self.dtype = host, host.size, host.dtype
        self.nbytes, self.ptr = host.nbytes, host

    def set(self, values, stream=None):
        self.host[:] = values

    def get(self):
        return self.host.copy()


class Stream:
    def synchronize(self):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("signal_floor", [False, True])
def test_sweep_times_each_algorithm_that_takes_the_size(monkeypatch, signal_floor):
    from mpi4py import MPI
    # At 4 ranks the LL two-shot takes twice the one-shot's largest input.
    limit = algorithms.LL_MAX_BYTES
    world, calls, registered, floors = 4, [], [], []
    monkeypatch.setattr(latency, "pyar", types.SimpleNamespace(
        empty=lambda shape, dtype, **kw: HostArray(np.zeros(shape, dtype)),
        empty_like=lambda a: HostArray(np.zeros_like(a.host))))
    monkeypatch.setattr(latency, "_hip", types.SimpleNamespace(
        Stream=Stream, memset=lambda ptr, value, nbytes, stream: ptr.fill(value)))
    monkeypatch.setattr(latency.measure, "prefix", lambda a, n: HostArray(a.host[:n]))

    class Floor:
        def __init__(self, mpi, stream, graph_calls):
            assert graph_calls == 20

        def seconds(self, mode, iterations, warmup):
            floors.append(mode)
            return 2e-6

    monkeypatch.setattr(latency, "Floor", Floor)
    signals = []

    class SignalFloor(Floor):
        def __init__(self, mpi, stream, graph_calls, timeout_ns):
            super().__init__(mpi, stream, graph_calls)
            signals.append(("timeout", timeout_ns))

        def seconds(self, mode, iterations, warmup):
            signals.append(mode)
            return 3e-6

        def close(self):
            signals.append("closed")

    monkeypatch.setattr(latency, "SignalFloor", SignalFloor)

    def time_point(src, dst, algo, mode, iterations, stream):
        calls.append((src.nbytes, algo, mode))
        dst.host[:] = exact.expected_sum(dst.size, world)
        return {"oneshot": 10e-6, "twoshot": 12e-6, "ll": 5e-6, "ll_twoshot": 4e-6}[algo]

    comm = types.SimpleNamespace(world=world, max_size=64 << 20, register=registered.append,
                                 geometry=types.SimpleNamespace(timeout_ns=123))
    args = bench.parse_args(["--latency", "-b", str(limit), "-e", str(4 * limit),
                             "-d", "float32", "-n", "3"] + ["--signal-floor"] * signal_floor)
    shown = []
    rows = latency.sweep(args, comm, MPI.COMM_SELF, 4 * limit, shown.append, 20, time_point)
    sizes = (limit, 2 * limit, 4 * limit)
    taken = {limit: latency.ALGOS, 2 * limit: ("oneshot", "twoshot", "ll_twoshot"),
             4 * limit: ("oneshot", "twoshot")}
    assert rows == shown and [r["mode"] for r in rows] == ["eager", "graph"] * 3
    assert calls == [(n, algo, mode) for n in sizes for mode in latency.MODES
                     for algo in taken[n]]
    assert floors == ["eager", "graph"] * 3 and len(registered) == 3   # whole, then prefixes
    assert [r["target"] for r in rows] == [True, True] + [None] * 4
    assert [r["ll_us"] for r in rows] == [pytest.approx(5.0)] * 2 + [None] * 4
    assert [r["ll2_us"] for r in rows] == [pytest.approx(4.0)] * 4 + [None] * 2
    assert [r["best_vs_oneshot"] for r in rows] == [pytest.approx(0.4)] * 4 + [None] * 2
    assert all(r["wrong"] == 0 and r["floor_us"] == pytest.approx(2.0) for r in rows)
    if signal_floor:   # beside the empty kernel at every point, closed once at the end
        assert signals == [("timeout", 123)] + ["eager", "graph"] * 3 + ["closed"]
        assert all(r["signal_us"] == pytest.approx(3.0) for r in rows)
    else:
        assert signals == [] and all(r["signal_us"] is None for r in rows)

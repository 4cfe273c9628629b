"""pyar.bench --latency without a GPU: the row arithmetic (ratios, the
issue's target), LL left blank above its limit, the cells, the command
line, and the sweep's order of calls on stand-in arrays and streams."""
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
    assert row["ll_us"] is None and row["target"] is None
    assert row["ll_vs_oneshot"] is None and row["ll_vs_floor"] is None
    assert _cells(row) == ["1 MiB", "524288", "bfloat16", "eager", "30.00", "20.00", "-",
                           "3.00", "-", "-", "-", "0"]


def test_cells_follow_the_columns():
    row = latency.row(1024, 256, "float32", "graph",
                      {"oneshot": 10.0, "twoshot": 14.5, "ll": 5.0}, 4.0)
    cells = latency.cells(row)
    assert len(cells) == len(latency.COLUMNS)
    assert _cells(row) == ["1 KiB", "256", "float32", "graph", "10.00", "14.50", "5.00",
                           "4.00", "0.50x", "1.25x", "yes", "-"]
    assert _cells(dict(row, ll_us=9.0, target=False))[10] == "no"
    assert {name for name, _ in latency.COLUMNS} - {"size", "type"} <= set(row)


def test_ll_takes_sizes_up_to_its_segment():
    limit = algorithms.LL_MAX_BYTES
    assert latency.takes("ll", limit, 64 << 20) and not latency.takes("ll", limit + 1, 64 << 20)
    assert not latency.takes("ll", 64 << 10, 32 << 10)   # max_size below LL_MAX_BYTES
    assert latency.takes("oneshot", 64 << 20, 64 << 20)


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


def test_sweep_times_each_algorithm_that_takes_the_size(monkeypatch):
    from mpi4py import MPI
    limit = algorithms.LL_MAX_BYTES
    world, calls, registered, floors = 2, [], [], []
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

    def time_point(src, dst, algo, mode, iterations, stream):
        calls.append((src.nbytes, algo, mode))
        dst.host[:] = exact.expected_sum(dst.size, world)
        return {"oneshot": 10e-6, "twoshot": 12e-6, "ll": 5e-6}[algo]

    comm = types.SimpleNamespace(world=world, max_size=64 << 20, register=registered.append)
    args = bench.parse_args(["--latency", "-b", str(limit), "-e", str(2 * limit),
                             "-d", "float32", "-n", "3"])
    shown = []
    rows = latency.sweep(args, comm, MPI.COMM_SELF, 2 * limit, shown.append, 20, time_point)
    assert rows == shown and [r["mode"] for r in rows] == ["eager", "graph"] * 2
    assert calls == [(n, algo, mode) for n in (limit, 2 * limit) for mode in latency.MODES
                     for algo in (latency.ALGOS if n == limit else ("oneshot", "twoshot"))]
    assert floors == ["eager", "graph"] * 2 and len(registered) == 2   # whole, then prefix
    assert [r["target"] for r in rows] == [True, True, None, None]
    assert [r["ll_us"] for r in rows] == [pytest.approx(5.0)] * 2 + [None] * 2
    assert all(r["wrong"] == 0 and r["floor_us"] == pytest.approx(2.0) for r in rows)

"""pyar.bench without a GPU: sizes, tables, progress, exact inputs, the
host MPI baseline's arithmetic, and the command line."""
import io

import numpy as np
import pytest

pytest.importorskip("mpi4py")

from pyar.bench import exact, report, sizes  # noqa: E402
from pyar.bench import __main__ as bench  # noqa: E402
from pyar.bench.progress import Progress  # noqa: E402
from pyar.bench.table import Table, markdown  # noqa: E402


@pytest.mark.parametrize("text, expected", [
    ("1024", 1024), ("64K", 64 << 10), ("64KB", 64 << 10), ("64KiB", 64 << 10),
    ("16M", 16 << 20), ("16MiB", 16 << 20), ("16 MB", 16 << 20), ("1g", 1 << 30),
    ("0.5K", 512), ("2T", 2 << 40),
])
def test_parse_size_takes_every_spelling(text, expected):
    assert sizes.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "sixteen", "16Q", "-4K", "1.5"])
def test_parse_size_refuses_nonsense(text):
    with pytest.raises(ValueError, match="size|bytes"):
        sizes.parse_size(text)


def test_human_bytes_and_doubling():
    assert [sizes.human_bytes(n) for n in (512, 1024, 1536, 16 << 20, 3 << 30)] == \
        ["512 B", "1 KiB", "1.5 KiB", "16 MiB", "3 GiB"]
    assert list(sizes.doubling(1024, 8192)) == [1024, 2048, 4096, 8192]
    assert list(sizes.doubling(1024, 1 << 20, 16)) == [1024, 16384, 262144]
    with pytest.raises(ValueError):
        list(sizes.doubling(1024, 4096, 1))


def test_table_rows_printed_one_at_a_time_line_up():
    table = Table(["size", "time_us"], [8, 7])
    header = table.header().splitlines()
    lines = header + [table.row(["1 KiB", "12.50"]), table.row(["256 MiB", None])]
    assert len({len(line) for line in lines}) == 1, lines
    assert lines[0] == "|     size | time_us |"
    assert lines[1] == "|---------:|--------:|"
    assert lines[3].endswith("|       - |")
    with pytest.raises(ValueError, match="2 columns"):
        table.row(["only one"])


def test_markdown_sizes_columns_to_content():
    text = markdown(["a", "long name"], [["wide cell", 1], ["x", None]], title="T")
    lines = text.splitlines()
    assert lines[:2] == ["## T", ""]
    assert len({len(line) for line in lines[2:]}) == 1
    assert [c.strip() for c in lines[-1].split("|")[1:-1]] == ["x", "-"]


class FakeTerminal(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_draws_on_a_terminal_only(capsys):
    terminal, pipe = FakeTerminal(True), FakeTerminal(False)
    for stream in (terminal, pipe):
        progress = Progress(4, stream=stream)
        progress.step()
        progress.print("| row |")
        progress.step(3)
        progress.close()
    assert pipe.getvalue() == ""
    assert "\r[#######" in terminal.getvalue() and "4/4" in terminal.getvalue()
    assert capsys.readouterr().out == "| row |\n| row |\n"
    assert Progress(3, stream=terminal, enabled=False).enabled is False


@pytest.mark.parametrize("world", range(1, 9))
def test_exact_inputs_sum_exactly_in_every_dtype(world):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    count = 4099
    inputs = [exact.exact_inputs(count, r) for r in range(world)]
    assert all(not np.array_equal(inputs[0], other) for other in inputs[1:])
    total = exact.expected_sum(count, world)
    assert np.array_equal(total, np.sum(inputs, axis=0))
    # Every partial sum in any order is an integer of magnitude <= 32.
    assert np.abs(np.cumsum(np.abs(inputs), axis=0)).max() <= 32
    for dtype in (np.float16, ml_dtypes.bfloat16):
        assert np.array_equal(total.astype(dtype).astype(np.float32), total)
    assert exact.wrong_elements(total.astype(ml_dtypes.bfloat16), total) == 0


def test_wrong_elements_counts_every_difference():
    total = exact.expected_sum(1000, 4)
    bad = total.copy()
    bad[[0, 17, 999]] += 1
    bad[500] = np.nan
    assert exact.wrong_elements(bad, total) == 4
    assert exact.wrong_elements(total, exact.expected_sum(1000, 3)) > 0  # another world size
    with pytest.raises(ValueError, match="999 results against 1000"):
        exact.wrong_elements(total[:999], total)


def test_host_round_trip_sums_through_mpi(monkeypatch):
    """The baseline's steps on a fake device (host arrays), in one process:
    copied out, widened for bfloat16, reduced, narrowed, copied back."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from mpi4py import MPI
    from pyar.bench import host_mpi
    memory = {1: exact.exact_inputs(64, 0).astype(ml_dtypes.bfloat16),
              2: np.zeros(64, ml_dtypes.bfloat16)}

    def dtoh(dst, src, stream):
        dst[:] = memory[src].view(np.uint8)

    def htod(dst, src, stream):
        memory[dst].view(np.uint8)[:] = src

    monkeypatch.setattr(host_mpi._hip, "memcpy_dtoh", dtoh)
    monkeypatch.setattr(host_mpi._hip, "memcpy_htod", htod)

    class Stream:
        def synchronize(self):
            pass

    trip = host_mpi.HostRoundTrip(MPI.COMM_SELF, 128, ml_dtypes.bfloat16)
    trip.call(1, 2, 64, Stream())()
    assert np.array_equal(memory[2], memory[1])
    assert exact.wrong_elements(memory[2], exact.expected_sum(64, 1)) == 0


def test_short_flags_match_the_long_ones():
    short = bench.parse_args(["-b", "4K", "-e", "16MiB", "-f", "4", "-n", "7", "-w", "2",
                              "-c", "0", "-d", "float32"])
    long = bench.parse_args(["--min", "4K", "--max", "16M", "--factor", "4", "--iters", "7",
                             "--warmup", "2", "--check", "0", "--dtype", "float32"])
    for name in ("min", "max", "factor", "iters", "warmup", "check", "dtype"):
        assert getattr(short, name) == getattr(long, name), name
    assert (short.min, short.max, short.factor, short.check) == (4096, 16 << 20, 4, 0)
    assert bench.parse_args([]).check == 1


@pytest.mark.parametrize("argv, message", [
    (["-b", "1M", "-e", "4K"], "--min <= --max"),
    (["-b", "lots"], "not a size"),
    (["-f", "1"], "--factor"),
    (["--algos", "threeshot"], "threeshot"),
    (["--fused", "--plot", "x.png"], "--fused has no plot"),
    (["--node-size", "0"], "--node-size must be a positive"),
    (["--node-size", "2", "--graph"], "MPI calls cannot be captured"),
    (["--node-size", "2", "--fused"], "no --fused"),
])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as raised:
        bench.parse_args(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_plot_refused_before_measuring_without_matplotlib(monkeypatch, capsys):
    monkeypatch.setattr(report, "can_plot", lambda: False)
    with pytest.raises(SystemExit):
        bench.parse_args(["--plot", "out.png"])
    assert "pip install 'pyar[plot]'" in capsys.readouterr().err


def test_row_count_for_the_progress_bar():
    args = bench.parse_args(["-b", "1K", "-e", "8K", "--algos", "auto,oneshot", "--staged"])
    assert bench.point_count(args) == 4 * (1 + 2 + 1)   # mpi row + 2 algos + staged, 4 sizes


def test_row_count_across_nodes():
    args = bench.parse_args(["-b", "4K", "-e", "32K", "--node-size", "2"])
    assert bench.point_count(args, 2) == 4 * (1 + 2 + 2)   # mpi, 2 rail methods, rs + ag
    assert bench.point_count(args, 1) == 4 * (1 + 2)       # domains of one rank: no rs/ag
    # MPI GPU-aware: hier:device, and mpi/device where MPI can sum the dtype (float32)
    assert bench.point_count(args, 2, on_device=True) == 4 * (1 + 2 + 2 + 1)
    args = bench.parse_args(["-b", "4K", "-e", "32K", "--node-size", "2", "-d", "float32"])
    assert bench.point_count(args, 2, on_device=True) == 4 * (1 + 2 + 2 + 2)


def test_row_bandwidths():
    row = report.row(1 << 20, 1 << 18, "float32", "all_gather", "staged", 1e-3, 3 / 4)
    assert row["algbw_GBps"] == pytest.approx(1.048576) and row["time_us"] == 1000.0
    assert row["busbw_GBps"] == pytest.approx(1.048576 * 0.75)
    assert set(row) == {name for name, _ in report.COLUMNS if name not in ("size", "type")} | {
        "bytes", "dtype"}


def test_report_cells_follow_the_columns():
    row = {"bytes": 4096, "count": 2048, "dtype": "bfloat16", "algo": "auto:oneshot",
           "mode": "registered", "time_us": 12.345, "algbw_GBps": 0.33, "busbw_GBps": 0.5,
           "wrong": 0, "vs_mpi": 0.25, "hbm_eff": None}
    cells = report.cells(row)
    assert len(cells) == len(report.COLUMNS)
    line = report.table().row(cells)
    assert [c.strip() for c in line.split("|")[1:-1]] == [
        "4 KiB", "2048", "bfloat16", "auto:oneshot", "registered", "12.35", "0.33", "0.50",
        "0", "0.25", "-"]


def test_fused_cells_follow_the_columns():
    from pyar.bench import fused
    row = {"tokens": 16, "hidden": 4096, "quant": "none", "mode": "eager",
           "variant": "onestage", "fused_us": 10.0, "unfused_us": 25.0, "speedup": 2.5,
           "allreduce_us": 8.0, "bound": 3.125, "onestage_us": 10.0, "twostage_us": 14.25,
           "split_us": 12.5, "lamport_us": 7.5,
           "hbm_eff": 0.5, "norm_us": 4.0, "norm_eff": 0.75}
    line = fused.table().row(fused.cells(row))
    assert [c.strip() for c in line.split("|")[1:-1]] == [
        "16", "4096", "none", "eager", "onestage", "10.00", "25.00", "2.50x", "8.00", "3.12x",
        "10.00", "14.25", "12.50", "7.50", "50%", "4.00", "75%"]
    # lamport absent where it does not take the input, efficiencies unmeasured
    wide_row = dict(row, lamport_us=None, hbm_eff=None, norm_eff=None)
    assert fused.cells(wide_row)[-7:] == ["10.00", "14.25", "12.50", None, None, "4.00", None]

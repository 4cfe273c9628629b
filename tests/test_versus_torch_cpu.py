"""benchmarks/versus_torch.py without a GPU or torch: the rows, ratios and
table it prints, and that it keeps NVLink multicast off.
Its measurements need one GPU per rank (the several-GPU run)."""
import pytest

pytest.importorskip("mpi4py")

from benchmarks import versus_torch as vt  # noqa: E402


def test_bandwidths_follow_nccl_tests():
    algbw, busbw = vt.bandwidths(8 << 20, 1e-4, 8)
    assert algbw == pytest.approx((8 << 20) / 1e-4 / 1e9)
    assert busbw == pytest.approx(algbw * 2 * 7 / 8)
    assert vt.bandwidths(1024, None, 4) == (None, None)


def test_summarize_ratios_are_baseline_time_over_pyar_time():
    times = {"pyar": 10e-6, "nccl": 25e-6, "symm-1shot": 12e-6, "symm-2shot": 15e-6}
    row = vt.summarize(1 << 20, "graph", times, 4)
    assert row["bytes"] == 1 << 20 and row["mode"] == "graph"
    assert row["pyar"]["time_us"] == pytest.approx(10.0)
    assert row["nccl"]["busbw_GBps"] == pytest.approx((1 << 20) / 25e-6 / 1e9 * 1.5)
    assert row["pyar_over_nccl"] == pytest.approx(2.5)
    assert row["pyar_over_symm"] == pytest.approx(1.2)  # against the faster of the two


def test_summarize_leaves_unmeasured_baselines_out():
    row = vt.summarize(4096, "eager", {"pyar": 5e-6, "nccl": None, "symm-2shot": 4e-6}, 2)
    assert row["nccl"]["time_us"] is None and row["pyar_over_nccl"] is None
    assert row["symm-1shot"]["busbw_GBps"] is None
    assert row["pyar_over_symm"] == pytest.approx(0.8)  # pyar slower: below 1


def test_table_has_a_line_per_row_and_dashes_for_gaps():
    rows = [vt.summarize(1024, "eager", {"pyar": 8e-6, "nccl": 20e-6}, 8),
            vt.summarize(256 << 20, "graph", {"pyar": 1e-3, "nccl": 1.1e-3,
                                              "symm-1shot": 2e-3, "symm-2shot": 0.9e-3}, 8)]
    text = vt.table(rows, "title")
    lines = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines()
             if line.startswith("| ") and "size" not in line]
    assert len(lines) == 2
    assert lines[0][:2] == ["1 KiB", "eager"] and lines[0][-2:] == ["2.50", "-"]
    assert lines[1][:2] == ["256 MiB", "graph"] and lines[1][-2:] == ["1.10", "0.90"]


def test_multicast_stays_off():
    assert vt.MULTICAST_OFF == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    with open(vt.__file__) as f:
        source = f.read()
    assert "multimem_all_reduce" not in source, "a multicast kernel is timed"
    assert "cuMulticastCreate" not in source


def test_arguments():
    args = vt.parse_args(["--min", "4K", "--max", "1M", "--json", "x.json"])
    assert (args.min, args.max, args.json) == (4096, 1 << 20, "x.json")
    with pytest.raises(SystemExit):
        vt.parse_args(["--min", "1M", "--max", "4K"])


def test_plots_are_written(tmp_path):
    """Both the comparison's plot and pyar.bench's, through the shared plot_latency."""
    pytest.importorskip("matplotlib")
    from pyar.bench import report
    rows = [vt.summarize(size, mode, {"pyar": size * 1e-12 + 5e-6, "nccl": size * 2e-12 + 9e-6},
                         4) for size in (1024, 1 << 20, 64 << 20) for mode in vt.MODES]
    path = tmp_path / "versus.png"
    vt.save_plot(str(path), rows, "title")
    bench_rows = [{"bytes": size, "algo": "auto:oneshot", "mode": "graph", "time_us": 7.0}
                  for size in (1024, 4096)]
    bench_path = tmp_path / "bench.png"
    report.save_plot(str(bench_path), bench_rows, "title")
    for png in (path, bench_path):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

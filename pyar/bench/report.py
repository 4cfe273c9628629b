"""Printing and saving all-reduce benchmark results: an nccl-tests-style
table printed a row at a time, JSON for machines and a PNG plot for people."""
import importlib.util
import json

from pyar.bench.sizes import human_bytes
from pyar.bench.table import Table

COLUMNS = [("size", 10), ("count", 11), ("type", 9), ("algo", 13), ("mode", 10),
           ("time_us", 10), ("algbw_GBps", 10), ("busbw_GBps", 10), ("wrong", 5),
           ("vs_mpi", 6), ("hbm_eff", 7)]
LEGEND = ("mpi/host: the same sum through the host (device-to-host copy, mpi4py Allreduce, "
          "copy back), timed the same way; vs_mpi: pyar's time over it (below 1: pyar is "
          "faster); wrong: elements that differ from the exact sum, all ranks (- unchecked)")


def row(nbytes, count, dtype, algo, mode, seconds, bus_factor, wrong=None):
    """A measured row: ``nbytes`` over ``seconds`` is algbw, times
    ``bus_factor`` busbw (nccl-tests: all-reduce 2 (n - 1) / n, reduce-scatter
    and all-gather (n - 1) / n of the whole array)."""
    algbw = nbytes / seconds / 1e9
    return {"bytes": nbytes, "count": count, "dtype": dtype, "algo": algo, "mode": mode,
            "time_us": seconds * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor,
            "wrong": wrong, "vs_mpi": None, "hbm_eff": None}


def table():
    return Table([name for name, _ in COLUMNS], [width for _, width in COLUMNS])


def cells(row):
    return [human_bytes(row["bytes"]), row["count"], row["dtype"], row["algo"], row["mode"],
            f"{row['time_us']:.2f}", f"{row['algbw_GBps']:.2f}", f"{row['busbw_GBps']:.2f}",
            row.get("wrong"), None if row.get("vs_mpi") is None else f"{row['vs_mpi']:.2f}",
            None if row.get("hbm_eff") is None else f"{row['hbm_eff']:.0%}"]


def save_json(path, meta, rows):
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


def can_plot():
    return importlib.util.find_spec("matplotlib") is not None


def save_plot(path, rows, title):
    """A latency-versus-size plot per (algo, input)."""
    series = {}
    for row in rows:
        requested = row["algo"].split(":")[0]  # "auto:twoshot" is one auto series
        series.setdefault(f"{requested} ({row['mode']})", []).append(
            (row["bytes"], row["time_us"]))
    plot_latency(path, series, title)


def plot_latency(path, series, title):
    """Time per all-reduce against size, log-log, a line per label of
    ``series`` ({label: [(bytes, microseconds)]}).  Needs matplotlib (the
    ``plot`` extra); callers check ``can_plot()`` before measuring."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, points in sorted(series.items()):
        ax.plot(*zip(*points), marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time per all-reduce (µs)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""Printing and saving benchmark results: an nccl-tests-style table, JSON for
machines and a PNG plot for people."""
import json


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if n == int(n) else f"{n:.1f} {unit}"
        n /= 1024


COLUMNS = [("size", 10), ("count", 11), ("type", 9), ("algo", 13), ("mode", 10),
           ("time_us", 10), ("algbw_GBps", 11), ("busbw_GBps", 11), ("hbm_eff", 8)]


def table(rows, title):
    lines = [f"## {title}", "",
             "| " + " | ".join(name for name, _ in COLUMNS) + " |",
             "|" + "|".join("-" * (width + 2) for _, width in COLUMNS) + "|"]
    for row in rows:
        cells = [human_bytes(row["bytes"]), str(row["count"]), row["dtype"], row["algo"],
                 row["mode"], f"{row['time_us']:.2f}", f"{row['algbw_GBps']:.2f}",
                 f"{row['busbw_GBps']:.2f}",
                 "-" if row.get("hbm_eff") is None else f"{row['hbm_eff']:.0%}"]
        lines.append("| " + " | ".join(c.rjust(w) for c, (_, w) in zip(cells, COLUMNS)) + " |")
    return "\n".join(lines)


def save_json(path, meta, rows):
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


def save_plot(path, rows, title):
    """A latency-versus-size plot per (algo, input); skipped without matplotlib."""
    series = {}
    for row in rows:
        requested = row["algo"].split(":")[0]  # "auto:twoshot" is one auto series
        series.setdefault(f"{requested} ({row['mode']})", []).append(
            (row["bytes"], row["time_us"]))
    return plot_latency(path, series, title)


def plot_latency(path, series, title):
    """Time per all-reduce against size, log-log, a line per label of
    ``series`` ({label: [(bytes, microseconds)]}); False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
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
    return True

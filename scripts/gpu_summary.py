"""The GPU runner's last word: one Markdown summary of the suite and the
benchmarks, from junit.xml, results.jsonl and the benchmark JSON files."""
import argparse
import collections
import glob
import json
import os
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pyar.bench import table  # noqa: E402


def test_outcomes(junit_path):
    """{test file: Counter(outcome)} from pytest's junit XML."""
    outcomes = collections.defaultdict(collections.Counter)
    if not os.path.exists(junit_path):
        return outcomes
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        group = case.get("classname", "?").rsplit(".", 1)[-1]
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        outcomes[group][outcome] += 1
    return outcomes


def results_table(path):
    """The scenarios' report() rows, merged per (test, world, algo, dtype, ...)."""
    if not os.path.exists(path):
        return []
    merged = collections.OrderedDict()
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            key = tuple((k, repr(row[k])) for k in sorted(row)
                        if not isinstance(row[k], (int, float)) or k in ("world",))
            entry = merged.setdefault(key, dict(row, reports=0))
            if entry["reports"]:
                for k, v in row.items():
                    if k in ("calls", "mismatches", "checked") and isinstance(v, (int, float)):
                        entry[k] = max(entry[k], v)  # every rank reports the same call
            entry["reports"] += 1
    return list(merged.values())


def example_outcomes(path):
    """The runner's examples.tsv (command, exit, seconds) as rows."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        head, *lines = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    return [dict(zip(head, line)) for line in lines]


def markdown(rows, columns):
    """``rows`` (dicts) as a table of ``columns``; a missing key is an empty cell."""
    return table.markdown(columns, [[row.get(c, "") for c in columns] for row in rows])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--bench-dir")
    parser.add_argument("--build-seconds", type=float)
    parser.add_argument("--built", help="what the build step built")
    parser.add_argument("--test-status", type=int)
    args = parser.parse_args()

    print("# pyar GPU suite summary\n")
    if args.build_seconds is not None:
        what = f" ({args.built})" if args.built else ""
        print(f"build{what}: {args.build_seconds:.0f} s\n")
    outcomes = test_outcomes(os.path.join(args.out, "junit.xml"))
    rows = [{"tests": group, **{k: counts.get(k, 0) for k in ("passed", "failed", "skipped")}}
            for group, counts in sorted(outcomes.items())]
    total = collections.Counter()
    for counts in outcomes.values():
        total.update(counts)
    rows.append({"tests": "**total**", **{k: total.get(k, 0)
                                          for k in ("passed", "failed", "skipped")}})
    print("## Tests\n")
    print(markdown(rows, ["tests", "passed", "failed", "skipped"]))
    print(f"\npytest exit status: {args.test_status}\n")

    examples = example_outcomes(os.path.join(args.out, "examples.tsv"))
    if examples:
        print("## Examples\n")
        print(markdown(examples, ["command", "exit", "seconds"]))
        print()

    results = results_table(os.path.join(args.out, "results.jsonl"))
    if results:
        print("## Scenario results (calls and mismatches per configuration)\n")
        by_test = collections.OrderedDict()
        for row in results:
            by_test.setdefault(row.get("test", "?"), []).append(row)
        for test, rows in by_test.items():
            columns = []
            for row in rows:
                columns += [k for k in row if k not in columns and k not in ("reports", "test")]
            print(f"### {test}\n")
            print(markdown(rows, columns))
            print()

    launch = os.path.join(args.out, "launch.json")
    if os.path.exists(launch):
        with open(launch) as f:
            data = json.load(f)
        rows = data.get("rows", data) if isinstance(data, dict) else data
        if isinstance(rows, list) and rows:
            print("## Launch overhead\n")
            print(markdown(rows, list(rows[0])))
            print()

    merged = {}
    bench_dir = args.bench_dir or args.out
    for kind in ("bench", "fused", "nodes"):
        for path in sorted(glob.glob(os.path.join(bench_dir, f"{kind}_w*.json"))):
            print_bench(path, kind, merged)
    for path in sorted(glob.glob(os.path.join(bench_dir, "versus_w*.json"))):
        print_versus(path, merged)
    if merged:
        with open(os.path.join(args.out, "bench.json"), "w") as f:
            json.dump(merged, f, indent=1)


def print_bench(path, kind, merged):
    with open(path) as f:
        data = json.load(f)
    meta = data["meta"]
    merged[os.path.basename(path)[:-len(".json")]] = data
    what = {"fused": "pyar.bench --fused", "nodes": f"pyar.bench --node-size "
            f"{meta.get('node_size')} ({meta.get('domains')} simulated nodes)"}.get(kind, "pyar.bench")
    print(f"## {what}, {meta['world']} ranks, {meta['device']}, {meta['dtype']}\n")
    columns = []
    for row in data["rows"]:
        columns += [k for k in row if k not in columns]
    print(markdown([{k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in r.items()}
                    for r in data["rows"]], columns))
    print()


def print_versus(path, merged):
    from benchmarks import versus_torch
    with open(path) as f:
        data = json.load(f)
    meta = data["meta"]
    merged[f"versus_w{meta['world']}"] = data
    print(versus_torch.table(data["rows"], f"pyar vs NCCL vs torch symmetric memory, "
                             f"{meta['world']} x {meta['device']}, {meta['dtype']}"))
    for name, error in meta.get("failures", {}).items():
        print(f"\n{name} not measured where '-': {error}")
    print()


if __name__ == "__main__":
    main()

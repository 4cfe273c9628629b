"""The registers and spills of every kernel, from the compilers' own reports
(AMD: -Rpass-analysis=kernel-resource-usage; CUDA: ptxas -v), so that a
kernel that spills shows in the build's log, on a machine without a GPU.

The build writes the table to kernel_resources.md next to the code objects
and logs per source and arch the kernels that spill to memory (AMD: VGPR
spills or scratch; SGPR spills go to VGPR lanes and are only listed in the
table).
"""
import re

REPORT_NAME = "kernel_resources.md"


def amd_resources(text):
    """[{kernel, VGPRs, AGPRs, SGPRs, scratch, VGPR spill, SGPR spill,
    occupancy}] from clang's kernel-resource-usage remarks."""
    fields = {"VGPRs": "vgprs", "AGPRs": "agprs", "SGPRs": "sgprs",
              "ScratchSize [bytes/lane]": "scratch", "VGPRs Spill": "vgpr_spill",
              "SGPRs Spill": "sgpr_spill", "Occupancy [waves/SIMD]": "occupancy"}
    rows = []
    for match in re.finditer(r"remark:\s+(Function Name|[A-Za-z][\w \[\]/]*?): (\S+) \[", text):
        name, value = match.group(1), match.group(2)
        if name == "Function Name":
            rows.append({"kernel": value})
        elif rows and name in fields:
            rows[-1][fields[name]] = int(value)
    return rows


def cuda_resources(text):
    """[{kernel, arch, registers, spill_stores, spill_loads, stack}] from ptxas -v."""
    rows, current, properties_of = [], None, None
    for line in text.splitlines():
        entry = re.search(r"Compiling entry function '(\w+)' for '(sm_\d+)'", line)
        if entry:
            current = {"kernel": entry.group(1), "arch": entry.group(2)}
            rows.append(current)
            continue
        properties = re.search(r"Function properties for (\S+)", line)
        if properties:  # also printed for device functions that were not inlined
            properties_of = properties.group(1)
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                          r"(\d+) bytes spill loads", line)
        if frame and current and properties_of == current["kernel"]:
            current.update(stack=int(frame.group(1)), spill_stores=int(frame.group(2)),
                           spill_loads=int(frame.group(3)))
        registers = re.search(r"Used (\d+) registers", line)
        if registers and current:
            current["registers"] = int(registers.group(1))
    return rows


def resource_row(row):
    """(table cells from "registers" on, whether the kernel spills to memory)."""
    if "vgprs" in row:  # AMD: SGPRs spill into VGPR lanes, VGPRs into scratch memory
        return [row["vgprs"], f"{row.get('agprs', 0)}/{row.get('sgprs', 0)}",
                f"{row.get('vgpr_spill', 0)} VGPRs, {row.get('sgpr_spill', 0)} SGPRs",
                row.get("scratch", 0), row.get("occupancy", "")], \
            bool(row.get("vgpr_spill", 0) or row.get("scratch", 0))
    stores, loads = row.get("spill_stores", 0), row.get("spill_loads", 0)
    return [row.get("registers", ""), "", f"{stores} B stores, {loads} B loads",
            row.get("stack", 0), ""], bool(stores or loads)


def resource_report(results):
    """The markdown table of every kernel's registers and spills, and one
    summary line per (source, arch)."""
    lines = ["| source | arch | compiler | kernel | registers | AGPRs/SGPRs | spill | "
             "scratch or stack bytes | occupancy |", "| --- " * 9 + "|"]
    summary = []
    for source, arch, compiler, rows in results:
        spilled, most = [], 0
        for row in rows:
            cells, spills = resource_row(row)
            most = max(most, cells[0] or 0)
            if spills:
                spilled.append(row["kernel"])
            lines.append("| " + " | ".join(str(c) for c in [source, row.get("arch", arch),
                                                                compiler, row["kernel"], *cells])
                         + " |")
        summary.append(f"{source} {arch}: {len(rows)} kernels, at most {most} registers, "
                       + (f"{len(spilled)} spill to memory: {', '.join(spilled)}" if spilled
                          else "no spills to memory"))
    return "\n".join(lines) + "\n", summary

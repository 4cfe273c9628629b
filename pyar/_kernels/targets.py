"""Which GPU targets a shipped code object holds, read from its container
headers (no GPU, no toolchain needed): the archs of a CUDA fatbin's machine
code and PTX, or of a clang offload bundle's (hipcc --genco) code objects."""
import struct

_FATBIN_MAGIC = 0xBA55ED50
_BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"


def fatbin_targets(data):
    """[("elf" | "ptx", "sm_XY")] of every entry of every container in ``data``."""
    targets, offset = [], 0
    while offset + 16 <= len(data):
        magic, _, header_size, size = struct.unpack_from("<IHHQ", data, offset)
        if magic != _FATBIN_MAGIC:
            raise ValueError(f"not a fatbin container at byte {offset}")
        position, end = offset + header_size, offset + header_size + size
        while position < end:
            kind, _, entry_header, payload_size = struct.unpack_from("<HHIQ", data, position)
            arch, = struct.unpack_from("<I", data, position + 28)
            targets.append(({1: "ptx", 2: "elf"}.get(kind, str(kind)), f"sm_{arch}"))
            position += entry_header + payload_size
        offset = end
    return targets


def bundle_targets(data):
    """The gfx archs of a clang offload bundle's device entries, as written
    in their triples (``gfx90a``, ``gfx90a:xnack-``)."""
    if not data.startswith(_BUNDLE_MAGIC):
        raise ValueError("not a clang offload bundle")
    count, = struct.unpack_from("<Q", data, len(_BUNDLE_MAGIC))
    archs, position = [], len(_BUNDLE_MAGIC) + 8
    for _ in range(count):
        _, _, triple_size = struct.unpack_from("<QQQ", data, position)
        position += 24
        triple = data[position:position + triple_size].decode()
        position += triple_size
        if "amdgcn-amd-amdhsa-" in triple:  # e.g. hipv4-amdgcn-amd-amdhsa--gfx942:xnack-
            archs.append(triple.split("amdgcn-amd-amdhsa-", 1)[1].lstrip("-"))
    return archs


def cuda_runs_on(targets, arch):
    """Whether a fatbin with ``targets`` runs on ``arch`` (``"sm_90"``): machine
    code of the same major version and no newer minor, or PTX no newer than
    the device, which the driver compiles at load."""
    major, minor = divmod(int(arch[3:]), 10)
    for kind, target in targets:
        t_major, t_minor = divmod(int(target[3:]), 10)
        if kind == "elf" and t_major == major and t_minor <= minor:
            return True
        if kind == "ptx" and (t_major, t_minor) <= (major, minor):
            return True
    return False


def hip_runs_on(archs, arch):
    """Whether a bundle holding ``archs`` has code for ``arch`` (feature
    suffixes such as ``:xnack-`` are ignored: the base chip must match)."""
    return arch.split(":")[0] in {a.split(":")[0] for a in archs}

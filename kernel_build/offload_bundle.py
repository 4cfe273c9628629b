"""Code-object bundles in the format of clang-offload-bundler: the .hsaco
files pyar ships, one per source with the code object of every gfx arch.

Each arch may come from another AMD compiler, each run for one arch alone,
so the build writes the bundle itself instead of leaving it to hipcc
--genco; read_bundle takes it apart again for the tests and the
machine-code check.
"""
import struct

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
BUNDLE_ALIGNMENT = 4096  # as clang aligns each code object
HOST_TRIPLE = "host-x86_64-unknown-linux--"


def write_bundle(path, code_objects):
    """One bundle holding ``{arch: ELF bytes}``, as hipcc --genco makes it."""
    entries = [(HOST_TRIPLE, b"")] + [(f"hipv4-amdgcn-amd-amdhsa--{arch}", code)
                                      for arch, code in sorted(code_objects.items())]
    header_size = len(BUNDLE_MAGIC) + 8 + sum(24 + len(t) for t, _ in entries)
    offset = -(-header_size // BUNDLE_ALIGNMENT) * BUNDLE_ALIGNMENT
    header, body = [BUNDLE_MAGIC, struct.pack("<Q", len(entries))], b""
    for triple, code in entries:
        body += b"\0" * (offset - header_size - len(body))
        header += [struct.pack("<QQQ", offset, len(code), len(triple)), triple.encode()]
        body += code
        offset = -(-(header_size + len(body)) // BUNDLE_ALIGNMENT) * BUNDLE_ALIGNMENT
    with open(path, "wb") as f:
        f.write(b"".join(header) + body)


def read_bundle(data):
    """{triple: payload} of a bundle (what clang-offload-bundler --list shows)."""
    if not data.startswith(BUNDLE_MAGIC):
        raise ValueError(f"not a clang offload bundle: {data[:24]!r}")
    count, = struct.unpack_from("<Q", data, len(BUNDLE_MAGIC))
    entries, position = {}, len(BUNDLE_MAGIC) + 8
    for _ in range(count):
        offset, size, triple_size = struct.unpack_from("<QQQ", data, position)
        position += 24
        triple = data[position:position + triple_size].decode()
        position += triple_size
        entries[triple] = data[offset:offset + size]
    return entries

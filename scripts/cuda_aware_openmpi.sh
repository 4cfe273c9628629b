#!/usr/bin/env bash
# Builds a CUDA-aware Open MPI 4.1 from Debian's source package into PREFIX, makes the
# install relocatable (OPAL_PREFIX) and self-contained, and packs it as PREFIX.tar.gz (gzip:
# the GPU machine has tar and gzip but no zstd).
#
# Why: the GPU machine's Open MPI (Ubuntu's 4.1.6) and the PyPI MPI wheels are built without
# CUDA, so pyar's hierarchical rail can only hand MPI pinned host copies. This build keeps the
# libmpi.so.40 ABI of the 4.1 series, so an mpi4py built against the system's Open MPI 4.1 runs
# on it when LD_LIBRARY_PATH puts PREFIX/lib first.
#
# Usage: scripts/cuda_aware_openmpi.sh PREFIX
#   CUDA_HOME (default /usr/local/cuda): where include/cuda.h is; only the header is used:
#     Open MPI dlopens libcuda.so.1 at run time, so the result links no CUDA library.
#   BUILD_DIR (default /tmp/ompi-cuda-build), JOBS (default 2), TARBALL (default PREFIX.tar.gz).
# Needs: apt with Debian's deb-src for bookworm (added below if missing), gcc, make, patchelf.
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 PREFIX" >&2; exit 2; }
PREFIX=$(realpath -m "$1")
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
BUILD_DIR=${BUILD_DIR:-/tmp/ompi-cuda-build}
JOBS=${JOBS:-2}
TARBALL=${TARBALL:-$PREFIX.tar.gz}

[[ -f "$CUDA_HOME/include/cuda.h" ]] || { echo "no $CUDA_HOME/include/cuda.h" >&2; exit 1; }
command -v patchelf >/dev/null || apt-get install -y -q patchelf

# --- source: Debian's openmpi source package (bookworm ships 4.1.4) ---------------------------
if ! apt-cache showsrc openmpi 2>/dev/null | grep -q '^Version: 4\.1\.'; then
    cat > /etc/apt/sources.list.d/debian-src-bookworm.sources <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    apt-get update -q
fi
mkdir -p "$BUILD_DIR"
cd "$BUILD_DIR"
ls openmpi_4.1.*.orig.tar.* >/dev/null 2>&1 || apt-get source --download-only openmpi
orig=$(ls openmpi_4.1.*.orig.tar.* | head -n1)
version=${orig#openmpi_}; version=${version%%.orig.tar.*}
# Debian's own patches are left out on purpose: they change packaging (libdir, Fortran
# pkg-config, man pages) and ports (hurd, hppa, ia64) by editing configure.ac/Makefile.am, which
# would need the autotools to regenerate; upstream's tarball as Debian ships it builds as is.
src="$BUILD_DIR/openmpi-$version"
[[ -d "$src" ]] || tar xf "$orig"

# --- configure and build ----------------------------------------------------------------------
# Internal hwloc, libevent and PMIx are compiled into Open MPI's own libraries, so nothing of
# the build machine's versions of them is needed where it runs. Every network and accelerator
# library the build machine happens to have (verbs, UCX, libfabric, PSM) is refused by name, so
# the result depends on none of them; one node's ranks use the sm/vader and smcuda BTLs.
# ROMIO is left out (MPI-IO still works through ompio); C++ and Fortran bindings are off.
obj="$BUILD_DIR/obj"
mkdir -p "$obj"
cd "$obj"
if [[ ! -f Makefile ]]; then
    "$src/configure" --prefix="$PREFIX" \
        --with-cuda="$CUDA_HOME" \
        --with-hwloc=internal --with-libevent=internal --with-pmix=internal \
        --disable-mpi-fortran --disable-mpi-java --disable-mpi-cxx --disable-oshmem \
        --disable-io-romio --disable-static --enable-shared \
        --without-verbs --without-ucx --without-ofi --without-psm --without-psm2 \
        --without-fca --without-hcoll --without-knem --without-xpmem --without-tm \
        --without-lsf --without-alps --without-portals4 --without-ucc \
        --with-package-string="pyar CUDA-aware Open MPI" \
        CFLAGS="-O2" CXXFLAGS="-O2"
fi
make -j"$JOBS"
rm -rf "$PREFIX"
make install

# --- trim, strip, relocate, bundle ------------------------------------------------------------
rm -rf "$PREFIX/share/man" "$PREFIX/share/doc"
find "$PREFIX" -name '*.la' -delete
elf_files() {
    find "$PREFIX/bin" "$PREFIX/lib" -type f \
        -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print
}
elf_files | xargs strip --strip-unneeded

# Search paths relative to each file replace the absolute prefix libtool wrote in. Bundled
# libraries live in lib/bundled, which only these search paths name: LD_LIBRARY_PATH=PREFIX/lib
# then puts Open MPI's own libraries first without shadowing the system's zlib for a whole
# Python process.
for f in $(elf_files); do
    case "$(dirname "$f")" in
        "$PREFIX/bin") rpath='$ORIGIN/../lib:$ORIGIN/../lib/bundled' ;;
        "$PREFIX/lib") rpath='$ORIGIN:$ORIGIN/bundled' ;;
        *) rpath='$ORIGIN/..:$ORIGIN/../bundled' ;;  # lib/openmpi, lib/pmix: components
    esac
    patchelf --set-rpath "$rpath" "$f"
done

# glibc's libraries and the compiler runtime are on every Linux and stay out; libcuda is
# dlopened, never linked. Everything else that resolves outside PREFIX is copied in.
system_libs='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libutil|libresolv'
system_libs+='|libgcc_s)\.so'
foreign_libs() {
    for f in $(elf_files); do
        ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
    done | sort -u | while read -r name path; do
        [[ "$path" == "$PREFIX"/* || "$name" =~ $system_libs ]] || echo "$name $path"
    done
}
mkdir -p "$PREFIX/lib/bundled"
foreign_libs | while read -r name path; do
    echo "bundling $name from $path"
    cp -L "$path" "$PREFIX/lib/bundled/$name"
    patchelf --set-rpath '$ORIGIN' "$PREFIX/lib/bundled/$name"
done
left=$(foreign_libs; for f in $(elf_files); do ldd "$f" | grep 'not found' || true; done)
[[ -z "$left" ]] || { echo "not self-contained:"; echo "$left"; exit 1; } >&2

# --- check and pack ---------------------------------------------------------------------------
cuda_built=$(OPAL_PREFIX="$PREFIX" "$PREFIX/bin/ompi_info" --parsable --all \
    | grep 'mpi_built_with_cuda_support:value')
echo "$cuda_built"
[[ "$cuda_built" == *':true' ]] || { echo "Open MPI was built without CUDA support" >&2; exit 1; }

tar -C "$(dirname "$PREFIX")" -cf - "$(basename "$PREFIX")" | gzip -9 >"$TARBALL"
size=$(stat -c %s "$TARBALL")
awk -v f="$TARBALL" -v s="$size" 'BEGIN { printf "%s: %d bytes (%.1f MiB)\n", f, s, s / 1048576 }'

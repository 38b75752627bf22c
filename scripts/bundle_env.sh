# shellcheck shell=bash
# Makes the GPU bundle (.gpu-bundle/, from scripts/gpu_bundle.sh) usable on a machine without
# Open MPI, parallel HDF5, Boost.Program_options, BLIS or GoogleTest and without a package
# registry. Source it from bash (scripts/gpu_check.sh does); it defines
#
#   bundle_libraries_missing    prints what of quintet's build dependencies the system lacks
#                               (nothing, status 0: the system has them all)
#   bundle_activate [BUNDLE] [PREFIX]
#                               unpacks BUNDLE (default .gpu-bundle) into PREFIX (default
#                               build-bundle/prefix; once per bundle) and exports PATH,
#                               LD_LIBRARY_PATH, LIBRARY_PATH and Open MPI's and PMIx's relocation variables;
#                               sets the array BUNDLE_CMAKE_ARGS (the configure arguments that
#                               point CMake at the prefix) and BUNDLE_FRESH (1: unpacked now). Status 1, with the reason on stderr,
#                               if the bundle is missing or broken.
#   bundle_find_nccl [PREFIX]   finds NCCL's header and library (NCCL_ROOT, a system install, the
#                               CUDA toolkit, or the pip package nvidia-nccl-cu* beside PyTorch),
#                               prints "NCCL_ROOT<TAB>description", status 1 if there is none
#
# How the prefix is made (no root path is written, nothing is installed): `dpkg -x` of each
# package, except a library package whose every shared library the system's loader already has
# (its system copy, the same or newer, serves; nothing of the system's is shadowed) -- never for
# Open MPI, PMIx and HDF5, whose plugins and wrappers must match their own libraries, and
# Boost.Program_options, whose CMake files name the library file beside them -- and
# the fallbacks (libraries a minimal Debian has) the same way; QUINTET_BUNDLE_UNPACK_ALL=1
# unpacks every package, as for a system that had none of them (the offline test); then
#   - the links that Debian's maintainer scripts (update-alternatives, ldconfig) would have made:
#     mpirun, mpiexec, mpicc, mpicxx, h5pcc; the libraries' soname links (ldconfig -n);
#   - development links (libcrypto.so, libz.so, ...) to a library left to the system point at the
#     system's copy;
#   - h5pcc's prefix line is rewritten to the prefix; Open MPI relocates itself from OPAL_PREFIX
#     (its wrappers' data files use ${includedir}/${libdir}), OPAL_SYSCONFDIR (Debian's
#     openmpi-mca-params.conf), PMIX_PREFIX and its folders (PMIx's plugins and help files).

_bundle_multiarch() { echo "${BUNDLE_MULTIARCH:-x86_64-linux-gnu}"; }

bundle_libraries_missing() {
    local ma missing=() f
    ma=$(_bundle_multiarch)
    command -v mpicxx >/dev/null 2>&1 || missing+=("mpicxx (Open MPI)")
    command -v mpirun >/dev/null 2>&1 || missing+=("mpirun (Open MPI)")
    if ! command -v h5pcc >/dev/null 2>&1 && [[ ! -f /usr/include/hdf5/openmpi/hdf5.h ]]; then
        missing+=("parallel HDF5 (h5pcc)")
    fi
    [[ -f /usr/include/boost/program_options.hpp ]] || missing+=("Boost.Program_options")
    f=0
    for d in /usr/include/$ma/blis-openmp /usr/include/blis; do [[ -f $d/blis.h ]] && f=1; done
    [[ $f == 1 ]] || missing+=("BLIS (OpenMP build)")
    [[ -f /usr/include/gtest/gtest.h ]] || missing+=("GoogleTest")
    [[ -f /usr/include/pcre2.h ]] || missing+=("PCRE2")
    [[ -f /usr/include/sentencepiece_processor.h ]] || missing+=("SentencePiece")
    [[ -f /usr/include/nlohmann/json.hpp ]] || missing+=("nlohmann-json")
    [[ -f /usr/include/zstd.h ]] || missing+=("libzstd")
    [[ -f /usr/include/lzma.h ]] || missing+=("liblzma")
    ((${#missing[@]} == 0)) && return 0
    local IFS=,
    echo "${missing[*]}"
    return 1
}

# The shared libraries a package ships in the top library folders (file and link names).
_bundle_deb_sonames() {  # listing of dpkg-deb -c (a link's line ends "name -> target")
    sed -E 's/ -> .*//' <<< "$1" | awk '{print $NF}' |
        grep -E "^\./(usr/)?lib/$(_bundle_multiarch)/lib[^/]*\.so(\.[0-9]+.*)?$" | sed 's|.*/||' | sort -u
}

# Whether the system's loader has the library a file of this name provides: the name itself
# (libfoo.so.4, libboost_program_options.so.1.74.0, libdb-5.3.so are sonames), else its
# first version component (libfoo.so.4.0.1 -> libfoo.so.4: Debian names its files so).
_bundle_system_has_file() {
    _bundle_system_has "$1" || _bundle_system_has "$(sed -E 's/(\.so\.[0-9]+).*/\1/' <<< "$1")"
}

_bundle_ldconfig_p() {  # the loader's cache (ldconfig may be outside a non-root PATH), read once
    if [[ -z ${_BUNDLE_LDCACHE:-} ]]; then
        if command -v ldconfig >/dev/null 2>&1; then _BUNDLE_LDCACHE=$(ldconfig -p 2>/dev/null)
        else _BUNDLE_LDCACHE=$(/sbin/ldconfig -p 2>/dev/null); fi
        _BUNDLE_LDCACHE=${_BUNDLE_LDCACHE:-none}
    fi
    echo "$_BUNDLE_LDCACHE"
}

_bundle_system_has() {  # soname
    awk '{print $1}' <<< "$(_bundle_ldconfig_p)" | grep -xF "$1" >/dev/null ||
        [[ -e /usr/lib/$(_bundle_multiarch)/$1 || -e /lib/$(_bundle_multiarch)/$1 ]]
}

_bundle_system_path() {  # soname -> path of the system's copy
    local p
    p=$(_bundle_ldconfig_p | awk -v s="$1" '$1 == s && /x86-64|x86_64/ {print $NF; exit}')
    [[ -n $p ]] || for d in /usr/lib/$(_bundle_multiarch) /lib/$(_bundle_multiarch); do
        [[ -e $d/$1 ]] && { p=$d/$1; break; }
    done
    [[ -n $p ]] && echo "$p"
}

_bundle_unpack() {  # bundle prefix: fills prefix, writes prefix/.unpacked and prefix/unpack.log
    local bundle=$1 prefix=$2 ma deb pkg list sonames s all ln target name so sys
    ma=$(_bundle_multiarch)
    [[ -n $prefix && $prefix != / ]] || { echo "bundle: bad prefix '$prefix'" >&2; return 1; }
    command -v dpkg-deb >/dev/null 2>&1 || { echo "bundle: dpkg-deb not found (needed to unpack .deb files)" >&2; return 1; }
    rm -rf "$prefix" && mkdir -p "$prefix" || return 1
    : > "$prefix/unpack.log"
    for deb in "$bundle"/debs/*.deb; do
        pkg=$(dpkg-deb -f "$deb" Package) || { echo "bundle: $deb is not a Debian package" >&2; return 1; }
        case "$pkg" in
            # Always ours: Open MPI's, PMIx's and HDF5's plugins and wrappers must match their
            # libraries, and Boost's CMake files name the library file beside them.
            libopenmpi*|openmpi-*|libpmix*|libhdf5-openmpi*|libboost-program-options*) ;;
            *-dev) ;;          # headers and link names: always (and not listed: xz is slow on big ones)
            *)                 # a runtime library package (libfoo1, zlib1g): only shared libraries
                [[ ${QUINTET_BUNDLE_UNPACK_ALL:-0} == 1 ]] && { dpkg -x "$deb" "$prefix" || return 1
                    echo "bundle  $pkg (QUINTET_BUNDLE_UNPACK_ALL)" >> "$prefix/unpack.log"; continue; }
                list=$(dpkg-deb -c "$deb")
                sonames=$(_bundle_deb_sonames "$list")
                if [[ -n $sonames ]] && ! grep -qE '\./usr/(bin|include)/' <<< "$list"; then
                    all=1
                    for s in $sonames; do _bundle_system_has_file "$s" || { all=0; break; }; done
                    if [[ $all == 1 ]]; then
                        echo "system  $pkg ($(tr '\n' ' ' <<< "$sonames" | sed 's/ $//'))" >> "$prefix/unpack.log"
                        continue
                    fi
                fi ;;
        esac
        dpkg -x "$deb" "$prefix" || { echo "bundle: dpkg -x $deb failed" >&2; return 1; }
        echo "bundle  $pkg" >> "$prefix/unpack.log"
    done
    # update-alternatives' links (Debian's maintainer scripts are not run by dpkg -x).
    for ln in mpirun:mpirun.openmpi mpiexec:mpiexec.openmpi mpicc:mpicc.openmpi mpicxx:mpic++.openmpi \
              mpic++:mpic++.openmpi h5pcc:h5pcc.openmpi; do
        [[ -e $prefix/usr/bin/${ln#*:} ]] && ln -sfn "${ln#*:}" "$prefix/usr/bin/${ln%%:*}"
    done
    # The soname links ldconfig makes, in every folder of the prefix that holds shared libraries.
    local ldconfig=ldconfig
    command -v ldconfig >/dev/null 2>&1 || ldconfig=/sbin/ldconfig
    while read -r d; do "$ldconfig" -n "$d" 2>/dev/null; done < <(_bundle_lib_dirs "$prefix")
    # Development links whose library the system provides: to the system's copy.
    while IFS= read -r -d '' ln; do
        [[ -e $ln ]] && continue
        target=$(readlink "$ln"); name=${target##*/}
        so=$(sed -E 's/(\.so\.[0-9]+).*/\1/' <<< "$name")
        if sys=$(_bundle_system_path "$so"); then
            ln -sfn "$sys" "$ln"
            echo "link    ${ln#"$prefix"/} -> $sys" >> "$prefix/unpack.log"
        else
            echo "dangling ${ln#"$prefix"/} -> $target" >> "$prefix/unpack.log"
        fi
    done < <(find "$prefix" -type l -name 'lib*.so*' -print0)
    # h5pcc: its one absolute path.
    [[ -f $prefix/usr/bin/h5pcc.openmpi ]] &&
        sed -i "s|^prefix=\"/usr\"|prefix=\"$prefix/usr\"|" "$prefix/usr/bin/h5pcc.openmpi"
    return 0
}

_bundle_lib_dirs() {  # folders of the prefix that hold versioned shared libraries
    find "$1" \( -type f -o -type l \) -name 'lib*.so.[0-9]*' -printf '%h\n' | sort -u
}

bundle_activate() {
    local bundle=${1:-.gpu-bundle} prefix=${2:-build-bundle/prefix} ma stamp missing=() s d ld=""
    ma=$(_bundle_multiarch)
    unset _BUNDLE_LDCACHE; _bundle_ldconfig_p > /dev/null
    compgen -G "$bundle/debs/*.deb" >/dev/null || {
        echo "bundle: no packages in $bundle/debs: make the bundle with scripts/gpu_bundle.sh (where Debian's registry is reachable) and carry $bundle along" >&2
        return 1
    }
    bundle=$(cd "$bundle" && pwd -P)
    mkdir -p "$prefix" && prefix=$(cd "$prefix" && pwd -P) || return 1
    stamp=$(cat "$bundle/MANIFEST.txt" 2>/dev/null; ls -l "$bundle/debs"; _bundle_ldconfig_p | md5sum
            echo "${QUINTET_BUNDLE_UNPACK_ALL:-0}")
    stamp=$(md5sum <<< "$stamp" | cut -d' ' -f1)
    BUNDLE_FRESH=0
    if [[ $(cat "$prefix/.unpacked" 2>/dev/null) != "$stamp" ]]; then
        _bundle_unpack "$bundle" "$prefix" || return 1
        echo "$stamp" > "$prefix/.unpacked"
        # shellcheck disable=SC2034  # for the sourcing script
        BUNDLE_FRESH=1   # a CMake cache made against an earlier prefix may name files now gone
    fi
    # The libraries the bundle expects from the system (MANIFEST: not in the bundle).
    if [[ -f $bundle/system-libs.txt ]]; then
        while read -r s; do
            [[ -n $s ]] || continue
            _bundle_system_has "$s" || [[ -n $(find "$prefix" -name "$s" -print -quit) ]] || missing+=("$s")
        done < "$bundle/system-libs.txt"
        if ((${#missing[@]})); then
            echo "bundle: WARNING: the system lacks libraries the bundle's packages need: ${missing[*]} (programs that load them will fail)" >&2
        fi
    fi
    while read -r d; do ld+="${ld:+:}$d"; done < <(_bundle_lib_dirs "$prefix")
    export PATH="$prefix/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # The linker's -l search (h5pcc links -lcrypto -lcurl -lsz -lz without a -L for them).
    export LIBRARY_PATH="$prefix/usr/lib/$ma:$prefix/lib/$ma${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export OPAL_PREFIX="$prefix/usr" OPAL_SYSCONFDIR="$prefix/etc/openmpi"
    # PMIx (Debian: its own prefix below the library folder) takes each folder it was configured
    # with from the environment: its plugins and help files.
    local pm="$prefix/usr/lib/$ma/pmix2"
    export PMIX_PREFIX="$pm" PMIX_INSTALL_PREFIX="$pm" PMIX_EXEC_PREFIX="$pm" PMIX_LIBDIR="$pm/lib" \
           PMIX_PKGLIBDIR="$pm/lib/pmix" PMIX_DATAROOTDIR="$pm/share" PMIX_DATADIR="$pm/share" \
           PMIX_PKGDATADIR="$pm/share/pmix"
    # Without ssh (not bundled: one machine) Open MPI 4's launcher refuses to start even for
    # local ranks; any existing program satisfies its check, and it never runs for one host.
    command -v ssh >/dev/null 2>&1 || command -v rsh >/dev/null 2>&1 || export OMPI_MCA_plm_rsh_agent=false
    export QUINTET_BUNDLE_PREFIX="$prefix"
    # shellcheck disable=SC2034  # for the sourcing script
    BUNDLE_CMAKE_ARGS=(
        "-DCMAKE_PREFIX_PATH=$prefix/usr"
        "-DMPI_C_COMPILER=$prefix/usr/bin/mpicc.openmpi"
        "-DMPI_CXX_COMPILER=$prefix/usr/bin/mpic++.openmpi"
        "-DMPIEXEC_EXECUTABLE=$prefix/usr/bin/mpiexec.openmpi"
        "-DHDF5_C_COMPILER_EXECUTABLE=$prefix/usr/bin/h5pcc.openmpi"
        "-DQUINTET_BLIS_INCLUDE=$prefix/usr/include/$ma/blis-openmp"
        "-DQUINTET_BLIS_LIBRARY=$prefix/usr/lib/$ma/blis-openmp/libblis.so"
    )
    return 0
}

bundle_find_nccl() {
    local prefix=${1:-build-bundle/prefix} inc="" lib="" py d where=""
    if [[ -n ${NCCL_ROOT:-} && -f $NCCL_ROOT/include/nccl.h ]]; then
        inc=$NCCL_ROOT/include; where="NCCL_ROOT"
        for d in "$NCCL_ROOT/lib" "$NCCL_ROOT/lib64"; do
            lib=$(ls "$d"/libnccl.so* 2>/dev/null | head -1); [[ -n $lib ]] && break
        done
    fi
    if [[ -z $lib ]]; then
        for d in /usr/include /usr/local/cuda/include /usr/local/cuda*/include; do
            [[ -f $d/nccl.h ]] && { inc=$d; break; }
        done
        if [[ -n $inc ]]; then
            lib=$(_bundle_system_path libnccl.so.2) ||
                lib=$(ls /usr/local/cuda/lib64/libnccl.so* /usr/local/cuda*/lib64/libnccl.so* 2>/dev/null | head -1)
            where="system"
        fi
    fi
    if [[ -z $lib ]]; then
        # The pip package (nvidia-nccl-cu12/13) that PyTorch uses: nvidia/nccl/{include,lib}.
        for py in ${PYTHON:-} /opt/torch/.venv/bin/python3 python3 /usr/bin/python3; do
            command -v "$py" >/dev/null 2>&1 || continue
            d=$("$py" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null) || continue
            if [[ -f $d/include/nccl.h ]] && lib=$(ls "$d"/lib/libnccl.so* 2>/dev/null | head -1) && [[ -n $lib ]]; then
                inc=$d/include; where="pip package beside PyTorch ($py)"; break
            fi
        done
    fi
    if [[ -z $lib || -z $inc ]]; then
        echo "bundle: NCCL not found (no NCCL_ROOT, no nccl.h + libnccl.so in /usr or the CUDA toolkit, no pip package nvidia-nccl-cu*): the CUDA backend builds without the NCCL communicator" >&2
        return 1
    fi
    # CMake looks for include/nccl.h and lib/libnccl.so (pip ships only libnccl.so.2): a folder of links.
    local root=$prefix/nccl real
    real=$(readlink -f "$lib")
    mkdir -p "$root/lib" && ln -sfn "$(readlink -f "$inc")" "$root/include" &&
        ln -sfn "$real" "$root/lib/libnccl.so" && ln -sfn "$real" "$root/lib/libnccl.so.2" || return 1
    local ver
    ver=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH)/ {printf "%s%s", sep, $3; sep="."}' "$inc/nccl.h")
    printf '%s\t%s\n' "$(cd "$root" && pwd -P)" "NCCL ${ver:-?} from $where: $real"
}

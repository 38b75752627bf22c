#!/usr/bin/env bash
# Installs every Debian package quintet needs and builds it with CMake into build/.
# Safe to re-run: apt-get skips what is installed, CMake rebuilds what changed.
#   QUINTET_SKIP_APT=1   skip the package step (you installed the list below yourself)
#   QUINTET_CMAKE_ARGS   extra arguments for the configure step, e.g. -DQUINTET_CUDA=ON
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  g++ make cmake pkg-config git ca-certificates
  openmpi-bin libopenmpi-dev            # mpirun and MPI
  libhdf5-openmpi-dev                   # parallel HDF5 (MPI-IO)
  libboost-program-options-dev          # the input deck
  libblis-openmp-dev                    # sgemm (the default BLAS, CMake QUINTET_BLAS=blis)
  libopenblas-openmp-dev                # sgemm with -DQUINTET_BLAS=openblas; OpenMP builds share our thread pool
  libgtest-dev                          # GoogleTest
  zlib1g-dev libzstd-dev liblzma-dev    # prepare: gzip, zstd and xz inputs
  zstd xz-utils                         # the tests make compressed inputs with them
  libpcre2-dev                          # tokenizers: the pre-tokenizer patterns (PCRE2, JIT)
  libsentencepiece-dev                  # tokenizers: spm: models, through the SentencePiece library
  nlohmann-json3-dev                    # tokenizers: tokenizer.json
  libicu-dev                            # tokenizers: tokenizer.json's NFC normalizer (Qwen 2)
  liblbfgs-dev                          # scaling laws: L-BFGS for `quintet laws`
  python3-sentencepiece                 # the SentencePiece reference test
  python3 python3-numpy python3-h5py python3-torch  # reference model, benchmarks, HDF5 tools
  python3-matplotlib                    # plots (docs, quintet plot)
)

if [ "${QUINTET_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# shellcheck disable=SC2086
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${QUINTET_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
echo "setup: built build/quintet"

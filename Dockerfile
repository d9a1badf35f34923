# syntax=docker/dockerfile:1
# Tandem's image: one image for every pod. The operator's Deployment (the
# Helm chart) runs `tandem-operator`; the pool's pods run `tandem-agent
# --role=prefill|decode|router` (operator/children.cc). Every product binary
# is on PATH in /usr/local/bin.
#
# NOT BUILT HERE: the development machines have no Docker engine and no
# network beyond Debian's mirror, so this file has never been built; what
# can be checked without Docker is checked by tests/deploy/dockerfile_test.sh
# (stages, package lists, binaries, user, ports, commands). Build it on a
# machine with Docker and network access:
#   docker build -t tandem --build-arg CUDA_KEYRING_URL=... \
#     --build-arg DOCA_URL=... --build-arg DOCA_KEY_URL=... .
# (the three addresses are NVIDIA's, from its CUDA and DOCA installation
# guides; see the stages below).
#
# Package lists come from ./tandem (`./tandem packages ...`), the one list
# the developers' machines install from; nothing here repeats them.
#
# GPUs: the build passes TANDEM_ENABLE_CUDA=ON, which adds the CUDA kernels
# (libtandem_cuda, cuBLASLt GEMMs), tandem-gpu-kernel-check and the CUDA
# backend to the agent (`--device cuda`; docs/cuda.md; e2e/gpu-smoke.sh has
# passed on an H200 with binaries built like these: docs/cuda-build.md). Its
# agents run the CPU backend unless started with --device cuda (the operator
# passes it to roles with gpusPerPod), with the CUDA runtime, cuBLAS, NCCL and
# CUDA-enabled UCX in place.

# --- NVIDIA's CUDA repository for Debian 12 --------------------------------
# Added with NVIDIA's keyring package, as NVIDIA's CUDA installation guide
# documents for Debian 12 ("network repo"). NVIDIA publishes no Debian-based
# CUDA images, so both stages start from Debian 12 and install CUDA from here.
# The repository's address is a build argument, not written here: pass the
# URL of the `cuda-keyring_*_all.deb` that NVIDIA's guide names for debian12
# x86_64, e.g. --build-arg CUDA_KEYRING_URL=<NVIDIA's .../repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb>.
FROM debian:bookworm-slim AS cuda-repo
# apt needs the CA certificates for NVIDIA's https repositories (the slim
# image has none): ./tandem's IMAGE_BASE_PACKAGES.
COPY tandem /tmp/tandem
RUN /tmp/tandem packages --base --install && rm -rf /var/lib/apt/lists/* /tmp/tandem
ARG CUDA_KEYRING_URL
RUN test -n "$CUDA_KEYRING_URL" || { echo "pass --build-arg CUDA_KEYRING_URL=<NVIDIA's cuda-keyring .deb for debian12 x86_64> (see the comment above)" >&2; exit 1; }
ADD ${CUDA_KEYRING_URL} /tmp/cuda-keyring.deb
RUN dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb

# --- build stage: the project's Debian packages and the CUDA toolkit --------
FROM cuda-repo AS build
WORKDIR /src
COPY . .
# ./tandem installs its own list (the one `./tandem setup` installs) plus
# the CUDA toolkit from NVIDIA's repository; then a Release build of the
# product binaries only (no tests, no benchmarks), in /build: a build/ the
# checkout brings along belongs to another path.
RUN ./tandem packages --cuda --install \
 && cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=OFF \
      -DTANDEM_ENABLE_CUDA=ON -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
 && cmake --build /build --parallel \
 && ./tandem packages --runtime --cuda > /runtime-packages.txt

# --- runtime stage: the CUDA runtime for Debian 12 and the libraries --------
FROM cuda-repo AS runtime
# A CUDA-enabled UCX (GPU memory as a source and target of KV transfers:
# the cuda_copy and cuda_ipc transports) is not in Debian (its libucx0 has no
# CUDA transports) nor in NVIDIA's CUDA repository: NVIDIA ships it only in
# its DOCA-Host repository (packages `ucx` and `ucx-cuda`; the same UCX as
# HPC-X's). DOCA_URL is that repository for Debian 12 in the layout NVIDIA's
# DOCA-Host documentation gives for its online repository
# (.../doca/<version>/<distro>/<arch>/) and DOCA_KEY_URL its signing key,
# both from NVIDIA's DOCA downloads page (DOCA 2.9 or later for Debian 12),
# passed with --build-arg: no address is written here.
# ./tandem's runtime list with --cuda names ucx and ucx-cuda in place of
# Debian's libucx0.
ARG DOCA_URL
ARG DOCA_KEY_URL
RUN test -n "$DOCA_URL" -a -n "$DOCA_KEY_URL" || { echo "pass --build-arg DOCA_URL=<NVIDIA's DOCA-Host repository for debian12 x86_64> and DOCA_KEY_URL=<its GPG key> (see the comment above)" >&2; exit 1; }
# Readable by apt's _apt user (ADD of a URL makes the file 0600).
ADD --chmod=644 ${DOCA_KEY_URL} /usr/share/keyrings/doca.asc
RUN echo "deb [signed-by=/usr/share/keyrings/doca.asc] ${DOCA_URL} ./" > /etc/apt/sources.list.d/doca.list
# Only the shared libraries the binaries load (./tandem's RUNTIME_PACKAGES),
# the CUDA runtime and UCX; no compiler, no headers.
COPY --from=build /runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt
# The NVIDIA container toolkit mounts the driver's libraries for these
# capabilities. NVIDIA_VISIBLE_DEVICES is left to the device plugin, so
# pods that request no GPU (operator, routers) see none.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility

# Every product binary (bin/tandem-* of the build; the build stage builds
# no benchmarks or tests, and those are not named tandem-*).
COPY --from=build /build/bin/tandem-* /usr/local/bin/

# `docker run IMAGE --help` and `docker run IMAGE --role=router ...` run
# tandem-agent; `docker run IMAGE tandem-operator ...` runs that binary.
# Kubernetes' `command` (the chart's [tandem-operator], the operator's
# [tandem-agent]) replaces this entrypoint altogether.
RUN printf '%s\n' '#!/bin/sh' \
      '# The image entrypoint: a tandem-* program named first runs; otherwise tandem-agent gets the arguments.' \
      'case "$1" in tandem-*) exec "$@" ;; esac' \
      'exec tandem-agent "$@"' > /usr/local/bin/tandem-entrypoint \
 && chmod 0755 /usr/local/bin/tandem-entrypoint

# Non-root, numeric (so Kubernetes' runAsNonRoot can verify it): the
# operator's pods run as 65532 with a read-only root filesystem, and nothing
# here needs to write (no home, no state, no cache).
RUN groupadd --system --gid 65532 tandem \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin tandem
USER 65532:65532

# DESIGN.md §5: router OpenAI API 8000; agent HTTP (OpenAI, internal,
# metrics) 8100; agent UCX KV listener 8200; operator metrics/health 8080.
EXPOSE 8000 8100 8200 8080
ENTRYPOINT ["/usr/local/bin/tandem-entrypoint"]
CMD ["--help"]

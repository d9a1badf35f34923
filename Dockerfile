# Tandem image: one image for every pod role (tandem-agent --role=...) and the operator.
#
# NOTE: this cannot be built on the development machines (no Docker engine
# there, and no network beyond Debian's mirror); it describes the build for a
# machine that has both. The CUDA backend needs the CUDA toolkit in the build
# stage and the CUDA runtime in the final stage; the CPU-only image below is
# what the local stack runs.

# --- build stage ------------------------------------------------------------
FROM debian:bookworm AS build
WORKDIR /src
COPY . .
# ./tandem setup installs exactly the package list the developers use.
RUN ./tandem setup \
 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=OFF \
 && cmake --build build --parallel

# --- runtime stage ------------------------------------------------------------
FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libabsl20220623 libyaml-cpp0.7 libcpprest2.10 libxxhash0 \
      libsentencepiece0 libucx0 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/bin/ /usr/local/bin/
# Agent: OpenAI API / internal / metrics 8100, UCX KV listener 8200; operator 8080; router 8000.
EXPOSE 8000 8100 8200 8080
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tandem-agent"]

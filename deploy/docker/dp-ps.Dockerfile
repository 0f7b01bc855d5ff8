# dp-ps: built on Debian 12 (the project's platform), run on debian:12-slim
# with only the shared libraries it links, as a non-root user.
# From the repository root:
#   docker build -f deploy/docker/dp-ps.Dockerfile -t dp-ps:0.1.0 .
# deploy/tests/check-dockerfiles.js checks this file against the build tree.

FROM debian:12 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cmake ninja-build g++ pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev \
      libopenblas-dev zlib1g-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY proto proto
COPY common common
COPY server server
COPY worker worker
COPY tests tests
COPY bench bench
COPY python python
# Both binaries, in both Dockerfiles: their build stages are the same, so
# the second image reuses the first one's compile from the layer cache.
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDP_ENABLE_CUDA=OFF \
 && cmake --build build --target dp-ps --target dp-worker

FROM debian:12-slim
# The packages of the libraries dp-ps links (ldd), beyond libc6, libgcc-s1,
# libstdc++6 and zlib1g of the base image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libabsl20220623 libc-ares2 libcivetweb1 libgrpc++1.51 libgrpc29 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprotobuf32 \
      libre2-9 libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o 65532 -g 65532 /var/lib/dp-ps
# /var/lib/dp-ps (above) is where the state volume goes: Docker and Podman
# give a new named volume mounted there its owner, the image's user, as
# fsGroup does in Kubernetes.
COPY --from=build /src/build/server/dp-ps /usr/local/bin/dp-ps
# The uid/gid of the pods' securityContext in deploy/k8s.
USER 65532:65532
# grpc (--port), health (--health_port, plaintext, for probes), metrics
# (--metrics_port); set by DP_PORT, DP_HEALTH_PORT, DP_METRICS_PORT.
EXPOSE 5000 5001 9090
ENTRYPOINT ["/usr/local/bin/dp-ps"]

# syntax=docker/dockerfile:1
# dp-worker: built in NVIDIA's CUDA 13 devel image (the CUDA backend when the
# sources have it), run in the CUDA 13 runtime image as a non-root user, with
# the shared libraries it links beyond the C/C++ and CUDA runtimes (copied by
# collect-runtime-libs.sh) and Debian's Fashion-MNIST at its default path.
# From the repository root:
#   docker build -f deploy/docker/dp-worker.Dockerfile -t dp-worker:0.1.0 .
# deploy/tests/check-dockerfiles.js checks this file against the build tree.
ARG CUDA_VERSION=13.0.2

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
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
COPY deploy/docker/collect-runtime-libs.sh /usr/local/bin/
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDP_ENABLE_CUDA=ON \
 && cmake --build build --target dp-worker \
 && collect-runtime-libs.sh build/worker/dp-worker /out/lib

# The data set from Debian's package (the default --data_dir).
FROM debian:12-slim AS data
RUN apt-get update \
 && apt-get install -y --no-install-recommends dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/*

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
COPY --from=build /out/lib /opt/dp-worker/lib
RUN echo /opt/dp-worker/lib > /etc/ld.so.conf.d/dp-worker.conf && ldconfig
COPY --from=data /usr/share/datasets/fashion-mnist /usr/share/datasets/fashion-mnist
COPY --from=build /src/build/worker/dp-worker /usr/local/bin/dp-worker
# The uid/gid of the pods' securityContext in deploy/k8s.
USER 65532:65532
# health (--health_port), metrics (--metrics_port).
EXPOSE 5001 9090
ENTRYPOINT ["/usr/local/bin/dp-worker"]

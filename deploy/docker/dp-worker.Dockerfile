# dp-worker, two images from one file, both run as a non-root user with
# Debian's Fashion-MNIST at the default --data_dir:
#   cpu  debian:12-slim with dp-worker and exactly the Debian packages of
#        the libraries it links (no CUDA at all)
#   gpu  the cpu image plus the CUDA backend module (libdp_cuda.so, loaded
#        at run time) and the CUDA 13 runtime libraries it needs (cudart,
#        cuBLAS, cuBLASLt) from NVIDIA's Debian 12 repository. Needs an
#        NVIDIA driver of branch R580 or newer on the node; the module is
#        built for compute capability 7.5 to 12.0 plus PTX.
# From the repository root:
#   docker build -f deploy/docker/dp-worker.Dockerfile --target cpu -t dp-worker:0.1.0 .
#   docker build -f deploy/docker/dp-worker.Dockerfile --target gpu -t dp-worker:0.1.0-cuda .
# deploy/tests/check-dockerfiles.js checks this file against the build tree.
ARG CUDA_VERSION=13.0
ARG CUDA_PKG_VERSION=13-0

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

# The CUDA backend module, built on Debian 12 like dp-worker (same C++
# runtime) with NVIDIA's CUDA 13 packages for Debian 12.
FROM build AS cuda-build
ARG CUDA_VERSION
ARG CUDA_PKG_VERSION
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && curl -fsSLo /tmp/cuda-keyring.deb \
      https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
 && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      cuda-nvcc-${CUDA_PKG_VERSION} cuda-cudart-dev-${CUDA_PKG_VERSION} \
      libcublas-dev-${CUDA_PKG_VERSION} \
 && rm -rf /var/lib/apt/lists/*
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDP_ENABLE_CUDA=ON \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda-${CUDA_VERSION}/bin/nvcc \
 && cmake --build build --target dp_cuda

# The data set from Debian's package (the default --data_dir).
FROM debian:12-slim AS data
RUN apt-get update \
 && apt-get install -y --no-install-recommends dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/*

FROM debian:12-slim AS cpu
# The packages of the libraries dp-worker links (ldd), beyond libc6,
# libgcc-s1, libstdc++6 and zlib1g of the base image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libabsl20220623 libc-ares2 libcivetweb1 libgfortran5 libgrpc++1.51 \
      libgrpc29 libopenblas0-pthread libprometheus-cpp-core1.0 \
      libprometheus-cpp-pull1.0 libprotobuf32 libquadmath0 libre2-9 libssl3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=data /usr/share/datasets/fashion-mnist /usr/share/datasets/fashion-mnist
COPY --from=build /src/build/worker/dp-worker /usr/local/bin/dp-worker
# The uid/gid of the pods' securityContext in deploy/k8s.
USER 65532:65532
# health (--health_port), metrics (--metrics_port).
EXPOSE 5001 9090
ENTRYPOINT ["/usr/local/bin/dp-worker"]

FROM cpu AS gpu
ARG CUDA_VERSION
ARG CUDA_PKG_VERSION
USER root
# The CUDA runtime, cuBLAS and cuBLASLt (libcublas-*), nothing else; the
# driver's libcuda comes from the node through the NVIDIA container toolkit.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && curl -fsSLo /tmp/cuda-keyring.deb \
      https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
 && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      cuda-cudart-${CUDA_PKG_VERSION} libcublas-${CUDA_PKG_VERSION} \
 && apt-get purge -y curl && apt-get autoremove -y \
 && rm -rf /var/lib/apt/lists/* \
 && echo /usr/local/cuda-${CUDA_VERSION}/targets/x86_64-linux/lib \
      > /etc/ld.so.conf.d/dp-cuda.conf \
 && ldconfig
COPY --from=cuda-build /src/build/worker/libdp_cuda.so /usr/local/lib/dp-ps/libdp_cuda.so
# What the NVIDIA container toolkit reads: the GPUs and driver parts to
# mount, and the driver the image needs (CUDA 13: R580 or newer). No GPU
# unless one is asked for: the device plugin (a pod's nvidia.com/gpu
# limit) or `docker run --gpus` sets NVIDIA_VISIBLE_DEVICES to the GPUs
# given; "all" here showed a pod without a GPU limit every GPU of its node.
ENV NVIDIA_VISIBLE_DEVICES=void \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"
USER 65532:65532

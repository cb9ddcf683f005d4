# otel-llm image: `otel-llm serve|validate|simulate ...` (docker-compose.yml builds it with `build: .`).

# Stage 1: the wheel, with the compiled core (rust/, otel_llm._core) built by cargo. The final image
# carries no toolchain; a wheel without the core fails this stage rather than shipping the slow path.
# The core is built for this stage's CPython (not the stable ABI), so both stages use the same one.
FROM python:3.11-slim AS builder
ARG RUST_VERSION=1.95.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/root/.cargo/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
       | sh -s -- -y --profile minimal --default-toolchain "$RUST_VERSION"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rust ./rust
COPY otel_llm ./otel_llm
# The simulator is a package of its own beside the server; the compose demo runs it from this image.
COPY otel_llm_simulate ./otel_llm_simulate
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && python -c "import glob, zipfile; names = zipfile.ZipFile(glob.glob('/wheels/otel_llm-*.whl')[0]).namelist(); \
assert any(n.startswith('otel_llm/_core.') for n in names), 'the compiled core is not in the wheel'"

# Stage 2: the runtime image.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY --from=builder /wheels /wheels
RUN pip install /wheels/otel_llm-*.whl && rm -rf /wheels

# Not root: a user of its own (uid 10001, as the Helm chart's pod securityContext) owning only the
# data directory; a named volume mounted there takes its ownership on first use.
RUN groupadd --system --gid 10001 otel-llm \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/otel-llm --no-create-home otel-llm \
    && mkdir -p /var/lib/otel-llm /etc/otel-llm && chown 10001:10001 /var/lib/otel-llm
# The embedded defaults bind loopback; the image's config binds the container's every interface.
COPY deploy/docker/otel-llm.yaml /etc/otel-llm/config.yaml

# 4317 OTLP/gRPC, 4318 OTLP/HTTP, 9464 /metrics /healthz /readyz
EXPOSE 4317 4318 9464
WORKDIR /var/lib/otel-llm
USER 10001:10001
ENTRYPOINT ["otel-llm"]
CMD ["serve", "--config", "/etc/otel-llm/config.yaml"]

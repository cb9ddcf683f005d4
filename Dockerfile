# otel-llm image: `otel-llm serve|validate|simulate ...` (docker-compose.yml builds it with `build: .`).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY otel_llm ./otel_llm
# The simulator is a package of its own beside the server; the compose demo runs it from this image.
COPY otel_llm_simulate ./otel_llm_simulate
RUN pip install . && rm -rf /src

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

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

# 4317 OTLP/gRPC, 4318 OTLP/HTTP, 9464 /metrics /healthz /readyz
EXPOSE 4317 4318 9464
WORKDIR /var/lib/otel-llm
ENTRYPOINT ["otel-llm"]
CMD ["serve"]

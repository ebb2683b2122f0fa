# syntax=docker/dockerfile:1
# Multi-stage build: build the wheel in one stage, install only the wheel in a slim runtime.

FROM python:3.11-slim AS build
WORKDIR /src
RUN pip install --no-cache-dir build==1.2.2
COPY pyproject.toml README.md ./
COPY gateway ./gateway
RUN python -m build --wheel --outdir /wheels

FROM python:3.11-slim AS runtime
# No configuration is baked in, so the image forwards nowhere until it is told where: mount
# a config with your [[routes]] at /config/gateway.toml (read-only will do). Without one,
# `serve` stops at once, naming the missing file, and nothing is recorded or forwarded.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    IDEMPOTENCY_GATEWAY_CONFIG=/config/gateway.toml \
    IDEMPOTENCY_GATEWAY_SERVER__HOST=0.0.0.0 \
    IDEMPOTENCY_GATEWAY_STORE__URL=sqlite:////data/gateway.db
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --home-dir /data --shell /usr/sbin/nologin gateway \
    && mkdir -p /config /data \
    && chown gateway:gateway /data
USER 10001:10001
WORKDIR /data
VOLUME ["/config", "/data"]
EXPOSE 8080
# /healthz answers while the process lives; the image has no curl, so Python asks.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]
# SIGTERM: stop accepting, let upstream calls finish and record their receipts, exit.
STOPSIGNAL SIGTERM
ENTRYPOINT ["idempotency-gateway"]
CMD ["serve"]

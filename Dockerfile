# The one image of bucketnotify: `bucketnotify operator`, `bucketnotify delivery` and the admin
# CLI (charts/bucketnotify runs it with args [operator] or [delivery]).
#
# The project installs itself (`pip install .`), so pyproject.toml is the only list of what the
# image contains; tests/install/test_image.py checks that nothing else is installed.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A virtual environment is one directory to copy into the runtime stage, without pip's caches
# or the build backend.
RUN python -m venv /opt/bucketnotify
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
# The report job (bucketnotify_report) is part of the same distribution.
COPY spark/ spark/
RUN /opt/bucketnotify/bin/pip install . \
    && /opt/bucketnotify/bin/pip uninstall --yes pip setuptools

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/bucketnotify/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/bucketnotify /opt/bucketnotify
# The delivery service's dir:// queue store default; the chart mounts a volume here.
RUN mkdir -p /var/lib/bucketnotify/queues && chown -R 65532:65532 /var/lib/bucketnotify
# Non-root, numeric so that runAsNonRoot can verify it without a passwd entry.
USER 65532:65532
WORKDIR /var/lib/bucketnotify
EXPOSE 8085 9090
ENTRYPOINT ["bucketnotify"]
CMD ["--help"]

# The images of bucketnotify, from one file:
#   - operator and delivery service (default): `bucketnotify operator`, `bucketnotify delivery`
#     and the admin CLI (charts/bucketnotify runs it with args [operator] or [delivery]);
#   - the Spark report job: `--build-arg EXTRAS=report` on a base image that has Java
#     (deploy/local/images.sh builds both).
#
# The project installs itself (`pip install .`), so pyproject.toml is the only list of what an
# image contains; tests/install/test_image.py checks that nothing else is installed.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Empty, or "report" for the Spark job's pyspark, matplotlib and jinja2.
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A virtual environment is one directory to copy into the runtime stage, without pip's caches
# or the build backend.
RUN python -m venv /opt/bucketnotify
WORKDIR /src
COPY pyproject.toml README.md ./
# The dependencies first, from pyproject.toml alone (the package directories are still empty),
# so that a change to the code below reuses this layer instead of installing them again.
RUN mkdir -p operator/bucketnotify spark/bucketnotify_report \
    && /opt/bucketnotify/bin/pip install ".${EXTRAS:+[${EXTRAS}]}" \
    && /opt/bucketnotify/bin/pip uninstall --yes bucketnotify
COPY operator/ operator/
# The report job (bucketnotify_report) is part of the same distribution.
COPY spark/ spark/
RUN /opt/bucketnotify/bin/pip install --no-deps . \
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

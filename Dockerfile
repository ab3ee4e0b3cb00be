# The images of bucketnotify, from one file:
#   - operator and delivery service (default): `bucketnotify operator`, `bucketnotify delivery`
#     and the admin CLI (charts/bucketnotify runs it with args [operator] or [delivery]);
#   - the Spark report job (`--target report --build-arg EXTRAS=report`, with REPORT_BASE_IMAGE
#     naming a base that has PYTHON_IMAGE's Python and a Java 17 runtime): Spark, hadoop-aws for
#     s3a, the report job, and an entrypoint for Spark's driver and executor pods
#     (deploy/local/images.sh builds both, and both bases from Debian packages).
#
# The project installs itself (`pip install .`), so pyproject.toml is the only list of what an
# image contains; tests/install/test_image.py checks that nothing else is installed.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG REPORT_BASE_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Empty, or "report" for the Spark job's pyspark, matplotlib and jinja2.
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A virtual environment is one directory to copy into the runtime stage, without pip's caches
# or the build backend.
RUN python -m venv /opt/bucketnotify
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
# The dependencies first, from pyproject.toml alone (the package directories are still empty),
# so that a change to the code below reuses this layer instead of installing them again; at
# the versions of requirements.lock (make lock), those the tests ran with.
RUN mkdir -p operator/bucketnotify spark/bucketnotify_report \
    && /opt/bucketnotify/bin/pip install -c requirements.lock ".${EXTRAS:+[${EXTRAS}]}" \
    && /opt/bucketnotify/bin/pip uninstall --yes bucketnotify
COPY operator/ operator/
# The report job (bucketnotify_report) is part of the same distribution.
COPY spark/ spark/
RUN /opt/bucketnotify/bin/pip install --no-deps . \
    && /opt/bucketnotify/bin/pip uninstall --yes pip setuptools

FROM ${REPORT_BASE_IMAGE} AS report
RUN java -version >/dev/null 2>&1 || { echo "REPORT_BASE_IMAGE has no java on PATH: Spark needs \
a Java 17 runtime (e.g. Debian's openjdk-17-jre-headless) beside PYTHON_IMAGE's Python" >&2; exit 1; }
# hadoop-aws of Spark's own Hadoop release and what its POM needs, baked in: the pods of a
# SparkApplication reach no Maven repository. Before the project, so a code change keeps them.
ARG S3A_JARS="org.apache.hadoop:hadoop-aws:3.5.0 software.amazon.awssdk:bundle:2.35.4 \
software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3:1.3.1 \
org.wildfly.openssl:wildfly-openssl:2.2.5.Final"
# A mirror of Maven Central, if the build cannot reach it.
ARG MAVEN_REPOSITORY=https://repo1.maven.org/maven2
COPY spark/image/spark_jars.py /opt/bucketnotify-image/
RUN python3 /opt/bucketnotify-image/spark_jars.py fetch /opt/spark-jars ${S3A_JARS}
COPY --from=build /opt/bucketnotify /opt/bucketnotify
ENV PATH=/opt/bucketnotify/bin:$PATH \
    SPARK_HOME=/opt/bucketnotify/lib/python3.11/site-packages/pyspark \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Hadoop's login needs a user name for the uid; /opt/bucketnotify/spark is where a
# SparkApplication's mainApplicationFile finds the job (bucketnotify_report/__main__.py).
RUN python3 /opt/bucketnotify-image/spark_jars.py link /opt/spark-jars "$SPARK_HOME/jars" \
    && echo "bucketnotify:x:65532:65532::/tmp:/usr/sbin/nologin" >>/etc/passwd \
    && ln -s lib/python3.11/site-packages /opt/bucketnotify/spark
COPY spark/image/entrypoint.sh /opt/bucketnotify-image/
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["/opt/bucketnotify-image/entrypoint.sh"]

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
# Last, so that a new revision changes no layer above: the build passes both
# (deploy/local/images.sh: the version from pyproject.toml, the revision from git).
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="bucketnotify" \
      org.opencontainers.image.description="Bucket notifications for Ceph RGW-compatible S3 gateways, run the Kubernetes way: operator and delivery service" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/bucketnotify/bucketnotify" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"

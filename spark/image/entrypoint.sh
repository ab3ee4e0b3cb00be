#!/bin/bash
# The report image's entrypoint. Spark on Kubernetes starts its driver and executor pods with
# the first argument `driver` or `executor` and the rest in SPARK_* variables; the Spark
# operator's controller and webhook (the same image) with `controller` or `webhook`; anything
# else runs as given (e.g. `bucketnotify-report --help`).
set -euo pipefail

case "${1:-}" in
  driver)
    shift
    # The driver listens on the pod's IP (the executors connect to it there).
    cmd=("$SPARK_HOME/bin/spark-submit" --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS"
      --deploy-mode client "$@")
    ;;
  executor)
    shift
    # The driver passes the JVM options as SPARK_JAVA_OPT_0, _1, ... in this order.
    mapfile -t java_opts < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | cut -d= -f2-)
    cmd=(java "${java_opts[@]}" "-Xms$SPARK_EXECUTOR_MEMORY" "-Xmx$SPARK_EXECUTOR_MEMORY"
      -cp "${SPARK_CLASSPATH:+$SPARK_CLASSPATH:}$SPARK_HOME/conf:$SPARK_HOME/jars/*"
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID"
      --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID"
      --hostname "$SPARK_EXECUTOR_POD_IP" --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID"
      --podName "$SPARK_EXECUTOR_POD_NAME")
    ;;
  controller | webhook)
    cmd=(spark-operator "$@")
    ;;
  *)
    cmd=("$@")
    ;;
esac
# tini reaps what the JVM (or spark-submit's shell scripts) leave behind.
exec tini -s -- "${cmd[@]}"

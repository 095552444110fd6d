#!/bin/bash
# The replay image's entrypoint for Spark on Kubernetes. PySpark's pip package has Spark's jars and
# bin/ but not the image entrypoint of Spark's own images, so this is ours, doing what Spark's
# Kubernetes backend expects of one (resource-managers/kubernetes/docker/.../entrypoint.sh in Spark):
#   driver ARGS...  the driver pod: spark-submit in client mode, bound to $SPARK_DRIVER_BIND_ADDRESS
#   executor        an executor pod: KubernetesExecutorBackend, settings from $SPARK_EXECUTOR_* etc.
#   anything else   run as given (e.g. `python -m mqbalance.pipeline.main ...`, `bash`)
# Processes run under tini, which forwards signals and reaps children (Python workers, JVM forks).
set -euo pipefail

classpath="${SPARK_HOME}/jars/*"
[[ -n "${SPARK_EXTRA_CLASSPATH:-}" ]] && classpath="$classpath:$SPARK_EXTRA_CLASSPATH"
# Spark mounts its configuration (spark.properties, log4j2) there and says so in SPARK_CONF_DIR.
classpath="${SPARK_CONF_DIR:-$SPARK_HOME/conf}:$classpath"

case "${1:-}" in
  driver)
    shift
    cmd=("$SPARK_HOME/bin/spark-submit"
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:?set by Spark for the driver pod}"
      --deploy-mode client "$@")
    ;;
  executor)
    shift
    # Java options come as SPARK_JAVA_OPT_0, _1, ... in order.
    java_opts=()
    while IFS= read -r opt; do
      java_opts+=("$opt")
    done < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
    cmd=("$JAVA_HOME/bin/java" "${java_opts[@]}"
      "-Xms${SPARK_EXECUTOR_MEMORY:?}" "-Xmx${SPARK_EXECUTOR_MEMORY}"
      -cp "$classpath"
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend
      --driver-url "${SPARK_DRIVER_URL:?}"
      --executor-id "${SPARK_EXECUTOR_ID:?}"
      --cores "${SPARK_EXECUTOR_CORES:?}"
      --app-id "${SPARK_APPLICATION_ID:?}"
      --hostname "${SPARK_EXECUTOR_POD_IP:?}"
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}"
      --podName "${SPARK_EXECUTOR_POD_NAME:?}")
    ;;
  *)
    cmd=("$@")
    ;;
esac
((${#cmd[@]})) || cmd=(mqbalance replay --help)
exec /usr/bin/tini -s -- "${cmd[@]}"

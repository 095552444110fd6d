"""Spark for the replay's tests: a standalone cluster on loopback (``cluster``) and the replay with
``spark-submit`` on Kubernetes on a real node (``k8s``)."""

"""The programs the harness runs against its services: the product's operator and sidecar, the
consumer apps in real pods, and the Java and Go clients' worlds."""

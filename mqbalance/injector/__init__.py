"""The sidecar injector: a mutating admission webhook that adds the mqbalance sidecar to pods that ask
for it (docs/deploy.md, "Sidecar injection").

``spec`` (standard library only) is the one source of the sidecar container; ``certs`` makes and
rotates the webhook's certificates; ``webhook`` answers AdmissionReviews; ``main`` runs it all as
``mqbalance injector``. Importing this package imports none of them.
"""

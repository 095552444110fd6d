"""A cluster's keys and certificates, made with openssl: its CA, the API server's serving
certificate, the service-account signing key, the aggregation layer's CA and client, and whatever
client certificates a profile adds (a real node's API server -> kubelet client)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from harness.kube.errors import ClusterError

FRONT_PROXY_CLIENT = "front-proxy-client"
"""Common name of the API server's client certificate towards APIService servers."""
# P-256 keys: generated in milliseconds where RSA takes a noticeable part of start-up.
_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
_DAYS = "3650"


class Pki:
    """The key and certificate files of one cluster in ``directory`` (``NAME.key``, ``NAME.crt``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, name: str) -> Path:
        return self.directory / name

    def write_control_plane(self, serving_names: list[str]) -> None:
        """The CA, the API server's certificate for ``serving_names`` (subjectAltName entries), the
        service-account key pair, and the aggregation layer's CA and client certificate."""
        if shutil.which("openssl") is None:
            raise ClusterError("the openssl command is needed to make the cluster's keys")
        self.make_ca("ca", "mqbalance-local-ca")
        names = ",".join(serving_names)
        extra = f"subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\nsubjectAltName={names}\n"
        self.issue("apiserver", "/CN=kube-apiserver", "ca", "serverAuth", extra)
        sa_key, sa_pub = str(self.path("sa.key")), str(self.path("sa.pub"))
        self._openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", sa_key)
        self._openssl("ec", "-in", sa_key, "-pubout", "-out", sa_pub)
        # The aggregation layer's own CA and the client certificate the API server presents to an
        # APIService's server (which trusts that CA: kube-system/extension-apiserver-authentication).
        self.make_ca("front-proxy-ca", "mqbalance-front-proxy-ca")
        self.issue("front-proxy-client", f"/CN={FRONT_PROXY_CLIENT}", "front-proxy-ca", "clientAuth")

    def aggregation_flags(self) -> list[str]:
        """The API server's flags for the aggregation layer (APIServices): the identity it proxies
        with, and the CA and headers an extension server reads the caller from."""
        return [
            f"--requestheader-client-ca-file={self.path('front-proxy-ca.crt')}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.path('front-proxy-client.crt')}",
            f"--proxy-client-key-file={self.path('front-proxy-client.key')}",
        ]

    def make_ca(self, name: str, common_name: str) -> None:
        """A certificate authority: ``NAME.key`` and ``NAME.crt``."""
        self._openssl(
            "req", "-x509", *_EC_KEY, "-nodes", "-days", _DAYS,
            "-keyout", str(self.path(f"{name}.key")), "-out", str(self.path(f"{name}.crt")),
            "-subj", f"/CN={common_name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip

    def issue(self, name: str, subject: str, ca: str, usage: str, extra: str = "") -> None:
        """A key and a certificate ``NAME.key``, ``NAME.crt`` for ``subject``, signed by the CA
        ``ca`` for ``usage`` (serverAuth, clientAuth), with the ``extra`` extension lines."""
        ext = self.path(f"{name}.ext")
        ext.write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage={usage}\n{extra}"
        )
        key, csr, crt = (str(self.path(f"{name}.{suffix}")) for suffix in ("key", "csr", "crt"))
        self._openssl("req", *_EC_KEY, "-nodes", "-keyout", key, "-out", csr, "-subj", subject)
        self._openssl(
            "x509", "-req", "-in", csr, "-days", _DAYS,
            "-CA", str(self.path(f"{ca}.crt")), "-CAkey", str(self.path(f"{ca}.key")), "-CAcreateserial",
            "-extfile", str(ext), "-out", crt,
        )  # fmt: skip

    def _openssl(self, *args: str) -> None:
        result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ClusterError(f"openssl {args[0]} failed: {result.stderr.strip()}")

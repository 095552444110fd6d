"""The webhook's certificates: a private CA and a serving certificate signed by it, kept in one Secret.

No cert-manager: the injector makes them at start when the Secret holds none, and renews each when a
third of its lifetime is left. A new CA is published next to the previous one (the ``caBundle`` holds
both until the previous one expires), so the API server still trusts a replica that serves a
certificate of the previous CA while the rotation reaches it.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
PREVIOUS_CA_CERT = "ca-previous.crt"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
RENEW_FRACTION = 1 / 3
"""Renew a certificate when less than this fraction of its lifetime is left."""
CLOCK_SKEW = dt.timedelta(minutes=5)
"""Certificates are valid from this long before they are made (clocks of API servers differ)."""


@dataclass(frozen=True)
class Bundle:
    """The CA, the serving certificate, and the previous CA while it is still trusted (PEM)."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes
    previous_ca_cert: bytes = b""

    def ca_bundle(self, now: dt.datetime) -> bytes:
        """The API server's trust for the webhook: the CA, and the previous CA until it expires."""
        bundle = self.ca_cert
        if self.previous_ca_cert and not_after(self.previous_ca_cert) > now:
            bundle += self.previous_ca_cert
        return bundle

    def to_secret_data(self) -> dict[str, str]:
        data = {CA_CERT: self.ca_cert, CA_KEY: self.ca_key, TLS_CERT: self.cert, TLS_KEY: self.key}
        if self.previous_ca_cert:
            data[PREVIOUS_CA_CERT] = self.previous_ca_cert
        return {key: base64.b64encode(value).decode() for key, value in data.items()}

    @classmethod
    def from_secret_data(cls, data: Mapping[str, str] | None) -> Bundle | None:
        """The bundle a Secret holds; None when it holds none or an unreadable one."""
        if not data:
            return None
        try:
            raw = {key: base64.b64decode(value) for key, value in data.items()}
            bundle = cls(
                raw[CA_CERT], raw[CA_KEY], raw[TLS_CERT], raw[TLS_KEY], raw.get(PREVIOUS_CA_CERT, b"")
            )
            for pem in (bundle.ca_cert, bundle.cert):
                x509.load_pem_x509_certificate(pem)
            for pem in (bundle.ca_key, bundle.key):
                serialization.load_pem_private_key(pem, password=None)
        except (KeyError, ValueError, TypeError):
            return None
        return bundle


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def not_after(pem: bytes) -> dt.datetime:
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc


def not_before(pem: bytes) -> dt.datetime:
    return x509.load_pem_x509_certificate(pem).not_valid_before_utc


def renew_at(pem: bytes) -> dt.datetime:
    """When a certificate is due for renewal: a third of its lifetime before it expires (the lifetime
    counted from when it was made, not from its back-dated start)."""
    start, end = not_before(pem) + CLOCK_SKEW, not_after(pem)
    return end - max(end - start, dt.timedelta(0)) * RENEW_FRACTION


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_ca(
    now: dt.datetime, lifetime: dt.timedelta, name: str = "mqbalance-injector-ca"
) -> tuple[bytes, bytes]:
    """A self-signed CA that may sign only end-entity certificates; (certificate, key) in PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name}-{int(now.timestamp())}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def new_serving_cert(
    ca_cert: bytes, ca_key: bytes, hosts: Sequence[str], now: dt.datetime, lifetime: dt.timedelta
) -> tuple[bytes, bytes]:
    """A serving certificate for ``hosts`` (DNS names or IP addresses) signed by the CA, never valid
    past the CA; (certificate, key) in PEM."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host name")
    ca = x509.load_pem_x509_certificate(ca_cert)
    signer = serialization.load_pem_private_key(ca_key, password=None)
    if not isinstance(signer, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    end = min(now + lifetime, ca.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0][:64])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
        )
        .sign(signer, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _covers(cert_pem: bytes, hosts: Sequence[str]) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return set(names) >= {_san(h) for h in hosts}


def issued_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, TypeError, Exception):  # InvalidSignature is not a ValueError
        return False
    return True


@dataclass(frozen=True)
class Lifetimes:
    ca: dt.timedelta = dt.timedelta(days=365 * 5)
    cert: dt.timedelta = dt.timedelta(days=90)


def plan(
    current: Bundle | None, hosts: Sequence[str], now: dt.datetime, lifetimes: Lifetimes = Lifetimes()
) -> Bundle:
    """What the Secret should hold at ``now``: ``current`` itself when nothing is due, else a bundle with
    a new serving certificate (due, for other hosts, or not by the CA) and, when the CA is due, a new CA
    that keeps the old one as ``previous_ca_cert``."""
    if current is None:
        ca_cert, ca_key = new_ca(now, lifetimes.ca)
        cert, key = new_serving_cert(ca_cert, ca_key, hosts, now, lifetimes.cert)
        return Bundle(ca_cert, ca_key, cert, key)
    bundle = current
    if bundle.previous_ca_cert and not_after(bundle.previous_ca_cert) <= now:
        bundle = replace(bundle, previous_ca_cert=b"")
    if renew_at(bundle.ca_cert) <= now:
        ca_cert, ca_key = new_ca(now, lifetimes.ca)
        previous = bundle.ca_cert if not_after(bundle.ca_cert) > now else b""
        bundle = Bundle(ca_cert, ca_key, bundle.cert, bundle.key, previous)
    if (
        renew_at(bundle.cert) <= now
        or not _covers(bundle.cert, hosts)
        or not issued_by(bundle.cert, bundle.ca_cert)
    ):
        cert, key = new_serving_cert(bundle.ca_cert, bundle.ca_key, hosts, now, lifetimes.cert)
        bundle = replace(bundle, cert=cert, key=key)
    return bundle


def next_renewal(bundle: Bundle) -> dt.datetime:
    """The earliest moment :func:`plan` will change ``bundle``."""
    moments = [renew_at(bundle.ca_cert), renew_at(bundle.cert)]
    if bundle.previous_ca_cert:
        moments.append(not_after(bundle.previous_ca_cert))
    return min(moments)

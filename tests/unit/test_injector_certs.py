"""The injector's certificates: made when missing, renewed when a third of a lifetime is left, a new CA
published beside the previous one; and the Secret round trip."""

from __future__ import annotations

import datetime as dt
import ssl

import pytest
from cryptography import x509

from mqbalance.injector import certs

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HOSTS = ["mq-mqbalance-injector.mq-system.svc", "127.0.0.1"]
LIFE = certs.Lifetimes(ca=dt.timedelta(days=300), cert=dt.timedelta(days=30))


def test_a_first_plan_makes_a_ca_and_a_serving_certificate_for_the_hosts() -> None:
    bundle = certs.plan(None, HOSTS, NOW, LIFE)
    assert certs.issued_by(bundle.cert, bundle.ca_cert)
    cert = x509.load_pem_x509_certificate(bundle.cert)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [HOSTS[0]]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.not_valid_after_utc == NOW + LIFE.cert
    ca = x509.load_pem_x509_certificate(bundle.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert bundle.ca_bundle(NOW) == bundle.ca_cert
    # Python's TLS stack (as the webhook serves) takes the pair.
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_verify_locations(cadata=bundle.ca_cert.decode())


def test_nothing_changes_until_a_third_of_the_lifetime_is_left() -> None:
    bundle = certs.plan(None, HOSTS, NOW, LIFE)
    assert certs.plan(bundle, HOSTS, NOW + dt.timedelta(days=19), LIFE) is bundle
    assert certs.next_renewal(bundle) == NOW + dt.timedelta(days=20)


def test_the_serving_certificate_is_renewed_under_the_same_ca() -> None:
    bundle = certs.plan(None, HOSTS, NOW, LIFE)
    later = NOW + dt.timedelta(days=21)
    renewed = certs.plan(bundle, HOSTS, later, LIFE)
    assert renewed.ca_cert == bundle.ca_cert  # the caBundle stays as it is
    assert renewed.cert != bundle.cert
    assert certs.issued_by(renewed.cert, bundle.ca_cert)
    assert certs.not_after(renewed.cert) == later + LIFE.cert


def test_other_hosts_get_a_new_serving_certificate() -> None:
    bundle = certs.plan(None, HOSTS, NOW, LIFE)
    moved = certs.plan(bundle, ["other.mq-system.svc"], NOW, LIFE)
    assert moved.cert != bundle.cert
    assert moved.ca_cert == bundle.ca_cert


def test_a_new_ca_is_published_beside_the_previous_one_until_it_expires() -> None:
    bundle = certs.plan(None, HOSTS, NOW, LIFE)
    later = NOW + dt.timedelta(days=201)
    rotated = certs.plan(bundle, HOSTS, later, LIFE)
    assert rotated.ca_cert != bundle.ca_cert
    assert rotated.previous_ca_cert == bundle.ca_cert
    assert certs.issued_by(rotated.cert, rotated.ca_cert)
    # A replica still serving the old certificate stays trusted meanwhile.
    assert rotated.ca_bundle(later) == rotated.ca_cert + bundle.ca_cert
    gone = NOW + dt.timedelta(days=301)
    assert rotated.ca_bundle(gone) == rotated.ca_cert
    assert certs.plan(rotated, HOSTS, gone, LIFE).previous_ca_cert == b""


def test_a_serving_certificate_never_outlives_its_ca() -> None:
    short = certs.Lifetimes(ca=dt.timedelta(days=10), cert=dt.timedelta(days=30))
    bundle = certs.plan(None, HOSTS, NOW, short)
    assert certs.not_after(bundle.cert) == certs.not_after(bundle.ca_cert)


def test_the_secret_round_trip_and_unreadable_data() -> None:
    bundle = certs.plan(None, HOSTS, NOW, LIFE)
    assert certs.Bundle.from_secret_data(bundle.to_secret_data()) == bundle
    rotated = certs.plan(bundle, HOSTS, NOW + dt.timedelta(days=201), LIFE)
    assert certs.Bundle.from_secret_data(rotated.to_secret_data()) == rotated
    assert certs.Bundle.from_secret_data(None) is None
    assert certs.Bundle.from_secret_data({}) is None  # the chart's empty Secret
    broken = {**bundle.to_secret_data(), certs.TLS_CERT: "bm90IGEgY2VydA=="}
    assert certs.Bundle.from_secret_data(broken) is None  # then plan() makes a new bundle


def test_a_short_lifetime_is_not_due_at_once() -> None:
    # The back-dated start (clock skew) is not part of the lifetime: a 30 s certificate lasts 20 s.
    short = certs.Lifetimes(ca=dt.timedelta(days=1), cert=dt.timedelta(seconds=30))
    bundle = certs.plan(None, HOSTS, NOW, short)
    assert certs.next_renewal(bundle) == NOW + dt.timedelta(seconds=20)
    assert certs.plan(bundle, HOSTS, NOW + dt.timedelta(seconds=19), short) is bundle


def test_a_serving_certificate_needs_a_host() -> None:
    ca, key = certs.new_ca(NOW, LIFE.ca)
    with pytest.raises(ValueError, match="host"):
        certs.new_serving_cert(ca, key, [], NOW, LIFE.cert)

"""Brokers that check every request's signature: the credentials and the settings of each line's
ACL (4.x plain ACL, 5.x ACL 2.0)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from mqbalance.rocketmq.remoting import Credentials

AUTH_CREATE_USER = 3001
AUTH_CREATE_ACL = 3006
"""5.x RequestCode: ACL 2.0's user and ACL administration (``AdminBrokerProcessor``)."""


@dataclass(frozen=True)
class Acl:
    """Brokers that check every request's signature (RocketMQ's ``AclClientRPCHook``).

    4.x: plain ACL (``aclEnable=true``, ``conf/plain_acl.yml``): ``admin`` is an admin account,
    ``client`` may publish to and subscribe every topic and group; no address is whitelisted.
    5.x: ACL 2.0 (``authenticationEnabled``, ``authorizationEnabled``, users and ACLs kept by the
    broker in its store): ``admin`` is the initial (super) user, ``inner`` the credentials of the
    broker's own clients, ``client`` a normal user granted Pub, Sub and Get on every topic and group.
    The NameServer checks nothing, in either line.
    """

    admin: Credentials = field(default_factory=lambda: Credentials("mqbalance-admin", "admin-secret-0"))
    client: Credentials = field(default_factory=lambda: Credentials("mqbalance-client", "client-secret-0"))
    inner: Credentials = field(default_factory=lambda: Credentials("mqbalance-inner", "inner-secret-0"))


def plain_acl_yml(acl: Acl) -> str:
    # An empty whitelist: 127.0.0.1 gets no pass, unsigned requests are refused.
    return f"""globalWhiteRemoteAddresses: []
accounts:
  - accessKey: {acl.admin.access_key}
    secretKey: {acl.admin.secret_key}
    whiteRemoteAddress:
    admin: true
  - accessKey: {acl.client.access_key}
    secretKey: {acl.client.secret_key}
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
"""


def acl_broker_settings(acl: Acl, is_5x: bool) -> dict[str, str]:
    if not is_5x:
        return {"aclEnable": "true"}
    authn, authz = "org.apache.rocketmq.auth.authentication", "org.apache.rocketmq.auth.authorization"
    return {
        "authenticationEnabled": "true",
        "authorizationEnabled": "true",
        "authenticationProvider": f"{authn}.provider.DefaultAuthenticationProvider",
        "authenticationMetadataProvider": f"{authn}.provider.LocalAuthenticationMetadataProvider",
        "authorizationProvider": f"{authz}.provider.DefaultAuthorizationProvider",
        "authorizationMetadataProvider": f"{authz}.provider.LocalAuthorizationMetadataProvider",
        "initAuthenticationUser": json.dumps(
            {"username": acl.admin.access_key, "password": acl.admin.secret_key}, separators=(",", ":")
        ),
        # The broker's own clients (to other brokers) sign with these; made a super user at start.
        "innerClientAuthenticationCredentials": json.dumps(
            {"accessKey": acl.inner.access_key, "secretKey": acl.inner.secret_key}, separators=(",", ":")
        ),
    }

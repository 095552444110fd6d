"""A real local Kubernetes control plane: etcd + kube-apiserver + kube-controller-manager.

Two Kubernetes versions are supported side by side: the current release (the default), built
from Go modules, and v1.20.2, built from Debian bookworm's source package. Choose with the
``version`` argument or ``MQBALANCE_K8S_VERSION`` (``current``, ``1.20``, or a release such as
``v1.36.3``). The binaries are built once by ``hack/build-control-plane.sh`` into a per-user
cache (see docs/local-cluster.md). Everything listens on 127.0.0.1 only, on free ports, so
several clusters can run side by side. There is no kubelet and no scheduler: tests act those
out with :mod:`harness.kubelet`.

Only the standard library is imported here, so importing this module is cheap.

Command line::

    python -m harness.cluster up [--dir DIR] [--k8s 1.20]   # start, print KUBECONFIG, wait for Ctrl-C
    python -m harness.cluster build [--k8s 1.20]            # build or reuse the binaries
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

from harness import polling
from harness.kubeapi import KubeApi
from harness.paths import REPO, cache_dir
from harness.processes.command import run_command, serve_until_interrupted, stop_on_ctrl_c
from harness.processes.managed import Component
from harness.processes.net import free_port
from harness.processes.service import Service, forget, stop_at_exit
from harness.processes.workdir import WorkDir, owned_tempdir, sweep_stale_dirs

CURRENT_K8S_VERSION = "v1.37.2"
"""The release built from Go modules (hack/build-kubernetes.sh's default); the default cluster."""
LEGACY_K8S_VERSION = "v1.20.2"
"""Debian bookworm's ``kubernetes`` source package."""
K8S_VERSION_ENV = "MQBALANCE_K8S_VERSION"
"""Selects the cluster version when the caller does not: ``current``, ``1.20`` or ``v1.Y.Z``."""
OLDEST_MODULE_MINOR = 34
"""The oldest minor release (1.34) that hack/build-kubernetes.sh builds from Go modules."""
HELM_VERSION = "v3.17.2"
ADMIN_USER = "mqbalance-admin"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
FRONT_PROXY_CLIENT = "front-proxy-client"
"""Common name of the API server's client certificate towards APIService servers."""

# Controllers that need kubelets, a cloud provider or a CA we do not run. Garbage collection,
# namespace deletion and the service-account controllers stay on. Later releases accept these
# names as aliases of their "-controller" names.
DISABLED_CONTROLLERS = (
    "nodelifecycle",
    "attachdetach",
    "csrsigning",
    "csrapproving",
    "csrcleaner",
    "bootstrapsigner",
    "tokencleaner",
    "nodeipam",
    "persistentvolume-expander",
    "horizontalpodautoscaling",
    "ttl",
)
# 1.20 still runs the cloud provider's controllers; later releases moved them out of the
# controller manager and refuse the names.
DISABLED_CONTROLLERS_LEGACY = ("cloud-node-lifecycle", "route", "service")
# Split out of nodelifecycle in 1.29: evicts pods from tainted nodes, which only a kubelet and
# the node lifecycle controller would taint.
DISABLED_CONTROLLERS_CURRENT = ("taint-eviction-controller",)

# ServiceAccount admission would reject pods until the namespace's "default" account exists
# (a race in every fresh test namespace) and mounts tokens no kubelet will use.
# TaintNodesByCondition would taint every new Node not-ready forever without a kubelet.
DISABLED_ADMISSION_PLUGINS = ("ServiceAccount", "TaintNodesByCondition")

_BUILD_SCRIPT = REPO / "hack" / "build-control-plane.sh"
_REQUIRED = ("kube-apiserver", "kube-controller-manager", "kubectl")
# A cluster without the controller manager (the demo's: it runs no Deployments, no namespace
# deletion) needs only what `build-control-plane.sh --demo` builds.
_DEMO_REQUIRED = ("kube-apiserver", "kubectl")
_VERSION_RE = re.compile(r"v?1\.(\d+)(?:\.(\d+))?")
# On SIGTERM kube-apiserver closes its port at once but then waits up to 60 s for open
# watches to end; nothing here needs that drain.
_APISERVER_GRACE = 2.0
# P-256 keys: generated in milliseconds where RSA takes a noticeable part of start-up.
_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
_DAYS = "3650"


class ClusterError(RuntimeError):
    """The local control plane could not be built, started or reached."""


class KubectlError(subprocess.CalledProcessError):
    """A kubectl call failed; unlike its base class the message includes kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr: {(self.stderr or '').strip()}"


def resolve_version(requested: str | None = None) -> str:
    """The full release a request names: ``None`` reads ``MQBALANCE_K8S_VERSION`` (default
    ``current``); ``current`` or its minor (``1.37``) is CURRENT_K8S_VERSION; ``1.20`` or
    ``v1.20.2`` is LEGACY_K8S_VERSION; ``v1.Y.Z`` with Y >= 34 is that release, built from Go
    modules."""
    raw = os.environ.get(K8S_VERSION_ENV, "") if requested is None else requested
    value = raw.strip() or "current"
    if value == "current":
        return CURRENT_K8S_VERSION
    match = _VERSION_RE.fullmatch(value)
    if match is not None:
        minor, patch = int(match.group(1)), match.group(2)
        legacy_minor = minor_of(LEGACY_K8S_VERSION)
        if minor == legacy_minor and patch in (None, LEGACY_K8S_VERSION.rsplit(".", 1)[1]):
            return LEGACY_K8S_VERSION
        if patch is None and minor == minor_of(CURRENT_K8S_VERSION):
            return CURRENT_K8S_VERSION
        if patch is not None and minor >= OLDEST_MODULE_MINOR:
            return f"v1.{minor}.{patch}"
    where = f"{K8S_VERSION_ENV}={raw!r}" if requested is None else f"Kubernetes version {raw!r}"
    raise ClusterError(
        f"{where}: use 'current' ({CURRENT_K8S_VERSION}, the default), '1.20' ({LEGACY_K8S_VERSION}), "
        f"or a release v1.Y.Z with Y >= {OLDEST_MODULE_MINOR} that the Go module proxy serves"
    )


def minor_of(version: str) -> int:
    """``v1.37.2`` -> 37."""
    match = _VERSION_RE.fullmatch(version)
    if match is None:
        raise ClusterError(f"not a Kubernetes version: {version!r}")
    return int(match.group(1))


def is_legacy(version: str) -> bool:
    """Whether ``version`` is the Debian-built 1.20 (no CEL rules, no field selectors on CRDs)."""
    return version == LEGACY_K8S_VERSION


def default_bin_dir(version: str | None = None) -> Path:
    return cache_dir() / f"k8s-{resolve_version(version)}" / "bin"


def binaries_present(
    bin_dir: Path | None = None, version: str | None = None, *, controller_manager: bool = True
) -> bool:
    resolved = resolve_version(version)
    directory = bin_dir or default_bin_dir(resolved)
    # 1.20 uses Debian's etcd from PATH; a module build brings its own next to the apiserver.
    etcd = _find_etcd(directory) if is_legacy(resolved) else directory / "etcd"
    required = _REQUIRED if controller_manager else _DEMO_REQUIRED
    return (
        all(os.access(directory / name, os.X_OK) for name in required)
        and etcd is not None
        and os.access(etcd, os.X_OK)
    )


def ensure_binaries(
    bin_dir: Path | None = None, version: str | None = None, *, controller_manager: bool = True
) -> Path:
    """Return the bin dir, running the build script first when binaries are missing."""
    resolved = resolve_version(version)
    directory = bin_dir or default_bin_dir(resolved)
    if binaries_present(directory, resolved, controller_manager=controller_manager):
        return directory
    if bin_dir is not None and bin_dir != default_bin_dir(resolved):
        raise ClusterError(f"control-plane binaries missing in {bin_dir}")
    if not _BUILD_SCRIPT.is_file():
        raise ClusterError(
            f"control-plane binaries missing in {directory} and no build script at {_BUILD_SCRIPT}"
        )
    print(f"building the local control plane {resolved} with {_BUILD_SCRIPT} (once; cached)", file=sys.stderr)
    argv = ["bash", str(_BUILD_SCRIPT), "--k8s", resolved, *([] if controller_manager else ["--demo"])]
    result = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise ClusterError(f"{' '.join(argv[1:])} failed with exit code {result.returncode}")
    if not binaries_present(directory, resolved, controller_manager=controller_manager):
        raise ClusterError(f"{_BUILD_SCRIPT} finished but binaries are still missing in {directory}")
    return directory


def _find_etcd(bin_dir: Path) -> Path | None:
    candidate = bin_dir / "etcd"
    if os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("etcd")
    return Path(found) if found else None


_STALE_PREFIXES = ("mqbalance-cluster-", "mqbalance-etcd-")


class LocalCluster(Service):
    """etcd + kube-apiserver + kube-controller-manager on 127.0.0.1.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Everything started is
    stopped by process group on :meth:`stop`, at interpreter exit, on SIGTERM/SIGHUP and on
    Ctrl-C. Start it from a thread that outlives the cluster (normally the main thread): on
    Linux the components are told to exit when the starting thread dies.
    """

    listen_address = "127.0.0.1"
    """Where the API server listens and what the kubeconfig names (a real node's address on one)."""

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        *,
        bin_dir: str | os.PathLike[str] | None = None,
        ready_timeout: float = 120.0,
        build: bool = True,
        version: str | None = None,
        controller_manager: bool = True,
    ) -> None:
        """Create (not start) a cluster.

        ``workdir`` holds certificates, the kubeconfig and component logs; a temporary one
        (removed on stop) is used when omitted. etcd's data always lives in its own tmpfs
        directory. ``build`` lets :meth:`start` run the build script when binaries are missing.
        ``version`` picks the Kubernetes release (see :func:`resolve_version`); by default
        ``MQBALANCE_K8S_VERSION``, else the current release. ``controller_manager=False`` starts
        etcd and the API server only (no Deployments, garbage collection or namespace deletion).
        """
        self.version = resolve_version(version)
        self.minor = minor_of(self.version)
        self._with_controller_manager = controller_manager
        self._workdir = WorkDir(workdir, "cluster", ClusterError)
        self._bin_dir_arg = Path(bin_dir) if bin_dir is not None else None
        self._bin_dir: Path | None = None
        self.ready_timeout = ready_timeout
        self._build = build
        self._token = secrets.token_hex(24)
        self._etcd_dir: Path | None = None
        self._etcd_client_port = 0
        self._etcd_peer_port = 0
        self._apiserver_port = 0
        self._etcd: Component | None = None
        self._apiserver: Component | None = None
        self._controller_manager: Component | None = None
        self._api: KubeApi | None = None
        self._lock = threading.RLock()

    # -- public properties -------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        return self._workdir.path

    @property
    def kubeconfig(self) -> Path:
        """Path of the admin kubeconfig (token auth, CA pinned)."""
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        """The API server URL, e.g. ``https://127.0.0.1:41234``."""
        if not self._apiserver_port:
            raise ClusterError("cluster not started")
        return f"https://{self.listen_address}:{self._apiserver_port}"

    @property
    def token(self) -> str:
        """Bearer token of a user in the system:masters group."""
        return self._token

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is not None:
            return self._bin_dir
        return self._bin_dir_arg or default_bin_dir(self.version)

    @property
    def legacy(self) -> bool:
        """Whether this is the 1.20 control plane (no CEL rules, no CRD field selectors)."""
        return is_legacy(self.version)

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self._etcd_client_port}"

    @property
    def env(self) -> dict[str, str]:
        """The current environment with KUBECONFIG pointing at this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the running components, by name."""
        return {
            comp.name: comp.proc.pid
            for comp in (self._etcd, self._apiserver, self._controller_manager)
            if comp is not None and comp.proc is not None
        }

    @property
    def running(self) -> bool:
        components = [self._etcd, self._apiserver]
        if self._with_controller_manager:
            components.append(self._controller_manager)
        return all(c is not None and c.running() for c in components)

    # -- lifecycle ---------------------------------------------------------------------------

    def ensure_binaries(self) -> Path:
        cm = self._with_controller_manager
        if self._build:
            self._bin_dir = ensure_binaries(self._bin_dir_arg, self.version, controller_manager=cm)
        elif binaries_present(self.bin_dir, self.version, controller_manager=cm):
            self._bin_dir = self.bin_dir
        else:
            raise ClusterError(
                f"control-plane binaries missing in {self.bin_dir}; run "
                f"hack/build-control-plane.sh --k8s {self.version}"
            )
        return self._bin_dir

    def start(self) -> Self:
        with self._lock:
            if self._apiserver is not None:
                return self
            self._prepare_start()
            stop_at_exit(self)
            try:
                self._start_components()
            except BaseException:
                self.stop()
                raise
            return self

    def _prepare_start(self) -> None:
        """What must be there before anything runs (a subclass adds its own); nothing to stop when
        it fails."""
        self.ensure_binaries()

    def _start_components(self) -> None:
        """Everything this cluster runs, started in order; :meth:`start` stops it all on an error."""
        self._prepare_dirs()
        self._write_pki()
        self._write_auth()
        # A port picked free can be taken by someone else before the component binds
        # it (other clusters start concurrently): retry with fresh ports.
        for attempt in range(3):
            self._pick_ports()
            self._write_kubeconfigs()
            try:
                self._start_etcd()
                self._start_apiserver()
                break
            except ClusterError as exc:
                self._stop_components()
                if self._etcd_dir is not None:
                    shutil.rmtree(self._etcd_dir / "data", ignore_errors=True)
                if attempt == 2 or "address already in use" not in str(exc):
                    raise
        if self._with_controller_manager:
            self._start_controller_manager()

    def stop(self) -> None:
        """Stop everything this instance started; safe to call more than once."""
        with self._lock:
            self._stop_components()
            self._close_api()
            forget(self)
            if self._etcd_dir is not None:
                shutil.rmtree(self._etcd_dir, ignore_errors=True)
                self._etcd_dir = None
            self._workdir.remove()

    def restart_apiserver(self, *, kill: bool = False) -> None:
        """Stop the API server and start it again on the same port (clients see an outage).

        ``kill`` sends SIGKILL (a crash) instead of a graceful SIGTERM.
        """
        with self._lock:
            if self._apiserver is None:
                raise ClusterError("cluster not started")
            self._apiserver.stop(0 if kill else _APISERVER_GRACE)
            self._apiserver.start()
            self._wait_apiserver_ready(self._apiserver)

    def restart_etcd(self, *, kill: bool = False) -> None:
        """Stop etcd and start it again on the same ports and data (the API server reconnects).

        ``kill`` sends SIGKILL instead of SIGTERM; etcd data survives either way.
        """
        with self._lock:
            if self._etcd is None or self._apiserver is None:
                raise ClusterError("cluster not started")
            self._etcd.stop(0 if kill else 10.0)
            self._etcd.start()
            self._wait_etcd_ready(self._etcd)
            self._wait_apiserver_ready(self._apiserver)

    # -- helpers for callers -----------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the kubectl of this cluster's version against it; output is captured as text.

        ``timeout`` is the allowance on an unloaded machine, scaled (harness.polling.scaled)."""
        argv = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=polling.scaled(timeout), check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def apply_crds(
        self, path: str | os.PathLike[str], names: Sequence[str] = (), timeout: float = 60.0
    ) -> None:
        """``kubectl apply -f path``, then wait until the CRDs ``names`` are Established.

        On 1.20 kubectl's client-side validation refuses the fields 1.20 does not know
        (x-kubernetes-validations, selectableFields), so it is turned off there; the server then
        drops those fields, as every API server drops what it does not know.
        """
        validate = ["--validate=false"] if self.legacy else []
        self.kubectl("apply", *validate, "-f", str(path))
        self.wait_crds_established(names, timeout)

    def wait_crds_established(self, names: Sequence[str], timeout: float = 60.0) -> None:
        """Until every CRD of ``names`` reports Established=True (``timeout`` scaled for load).

        Polled here rather than with ``kubectl wait --for=condition=Established``: kubectl 1.37
        fails at once ("status.conditions accessor error: <nil>") when it reads a CRD the API
        server has not given a status yet, which a busy machine makes likely."""
        for name in names:
            established = functools.partial(self._established, name)
            polling.wait_for(f"CRD {name} to be Established", established, timeout, 0.1, ClusterError)

    def _established(self, name: str) -> bool:
        status, body = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        if status != 200 or not isinstance(body, dict):
            return False
        conditions = (body.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    @property
    def api(self) -> KubeApi:
        """The harness's blocking client (:mod:`harness.kubeapi`) as the admin of this cluster."""
        api = self._api
        if api is None:  # only the first call waits for the lock: a restart holds it meanwhile
            with self._lock:
                if self._api is None:
                    self._api = KubeApi.from_kubeconfig(self.kubeconfig)
                api = self._api
        return api

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 10.0,
        *,
        content_type: str | None = None,
    ) -> tuple[int, Any]:
        """A raw authenticated API call; returns (status, decoded JSON or text).

        ``body`` is sent as JSON; a PATCH is a JSON merge patch unless ``content_type`` says otherwise.
        """
        return self.api.call(method, path, body, content_type=content_type, timeout=timeout)

    def service_account_token(
        self,
        namespace: str,
        name: str,
        *,
        expiration_seconds: int = 3600,
        pod: tuple[str, str] | None = None,
    ) -> str:
        """A bound token of the ServiceAccount from the TokenRequest API; with ``pod`` (name, uid)
        bound to that pod, which must run as the account: the token a kubelet mounts into the pod,
        whose user the API server gives the pod's name and uid (``authentication.kubernetes.io/pod-*``).

        Both versions serve TokenRequest; only 1.20 also puts a token in a Secret (1.24 stopped).
        """
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        spec: dict[str, Any] = {"expirationSeconds": expiration_seconds}
        if pod is not None:
            spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": pod[0], "uid": pod[1]}
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        status, answer = self.request("POST", path, body)
        token = answer.get("status", {}).get("token") if isinstance(answer, dict) else None
        if status != 201 or not isinstance(token, str):
            raise ClusterError(f"TokenRequest for ServiceAccount {namespace}/{name}: {status} {answer}")
        return token

    def logs(self, lines: int = 25) -> str:
        """The tail of every component's log, for error messages."""
        parts = []
        for comp in (self._etcd, self._apiserver, self._controller_manager):
            if comp is not None:
                parts.append(f"--- {comp.name} ({comp.log}) ---\n{comp.tail(lines)}")
        return "\n".join(parts)

    # -- internals ---------------------------------------------------------------------------

    def _prepare_dirs(self) -> None:
        sweep_stale_dirs(_STALE_PREFIXES)
        workdir = self._workdir.make(lambda: owned_tempdir("mqbalance-cluster-"))
        (workdir / "logs").mkdir(exist_ok=True)
        (workdir / "pki").mkdir(exist_ok=True)
        self._etcd_dir = owned_tempdir("mqbalance-etcd-")

    def _openssl(self, *args: str) -> None:
        result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ClusterError(f"openssl {args[0]} failed: {result.stderr.strip()}")

    def _write_pki(self) -> None:
        if shutil.which("openssl") is None:
            raise ClusterError("the openssl command is needed to make the cluster's keys")
        pki = self.workdir / "pki"
        self._make_ca("ca", "mqbalance-local-ca")
        names = ",".join(self._serving_names())
        extra = f"subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\nsubjectAltName={names}\n"
        self._issue("apiserver", "/CN=kube-apiserver", "ca", "serverAuth", extra)
        self._openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(pki / "sa.key"))
        self._openssl("ec", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
        # The aggregation layer's own CA and the client certificate the API server presents to an
        # APIService's server (which trusts that CA: kube-system/extension-apiserver-authentication).
        self._make_ca("front-proxy-ca", "mqbalance-front-proxy-ca")
        self._issue("front-proxy-client", f"/CN={FRONT_PROXY_CLIENT}", "front-proxy-ca", "clientAuth")

    def _make_ca(self, name: str, common_name: str) -> None:
        """A certificate authority: ``pki/NAME.key`` and ``pki/NAME.crt``."""
        pki = self.workdir / "pki"
        self._openssl(
            "req", "-x509", *_EC_KEY, "-nodes", "-days", _DAYS,
            "-keyout", str(pki / f"{name}.key"), "-out", str(pki / f"{name}.crt"),
            "-subj", f"/CN={common_name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip

    def _issue(self, name: str, subject: str, ca: str, usage: str, extra: str = "") -> None:
        """A key and a certificate ``pki/NAME.key``, ``pki/NAME.crt`` for ``subject``, signed by the
        CA ``ca`` for ``usage`` (serverAuth, clientAuth), with the ``extra`` extension lines."""
        pki = self.workdir / "pki"
        ext = pki / f"{name}.ext"
        ext.write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage={usage}\n{extra}"
        )
        key, csr, crt = (str(pki / f"{name}.{suffix}") for suffix in ("key", "csr", "crt"))
        self._openssl("req", *_EC_KEY, "-nodes", "-keyout", key, "-out", csr, "-subj", subject)
        self._openssl(
            "x509", "-req", "-in", csr, "-days", _DAYS,
            "-CA", str(pki / f"{ca}.crt"), "-CAkey", str(pki / f"{ca}.key"), "-CAcreateserial",
            "-extfile", str(ext), "-out", crt,
        )  # fmt: skip

    def _aggregation_flags(self) -> list[str]:
        """The aggregation layer (APIServices): the identity the API server proxies with, and the CA
        and headers an extension server reads the caller from."""
        pki = self.workdir / "pki"
        return [
            f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        ]

    def _serving_names(self) -> list[str]:
        """subjectAltName entries of the API server's certificate (a real node adds its address)."""
        return [
            "IP:127.0.0.1",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "IP:10.96.0.1",
        ]

    def _write_auth(self) -> None:
        tokens = self.workdir / "pki" / "tokens.csv"
        tokens.write_text(f'{self._token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        tokens.chmod(0o600)

    def _pick_ports(self) -> None:
        self._etcd_client_port = free_port()
        self._etcd_peer_port = free_port()
        self._apiserver_port = free_port()
        self._close_api()

    def _kubeconfig_document(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "mqbalance-local",
                    # Embedded, so a copied kubeconfig keeps working.
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": base64.b64encode(self.ca_file.read_bytes()).decode(),
                    },
                }
            ],
            "users": [{"name": ADMIN_USER, "user": {"token": self._token}}],
            "contexts": [
                {
                    "name": "mqbalance-local",
                    "context": {"cluster": "mqbalance-local", "user": ADMIN_USER, "namespace": "default"},
                }
            ],
            "current-context": "mqbalance-local",
        }

    def _write_kubeconfigs(self) -> None:
        # JSON is valid YAML, and every client (kubectl, the Python client, helm) reads it.
        self.kubeconfig.write_text(json.dumps(self._kubeconfig_document(), indent=2) + "\n")
        self.kubeconfig.chmod(0o600)

    def _start_etcd(self) -> None:
        etcd = _find_etcd(self.bin_dir)
        if etcd is None or self._etcd_dir is None:
            raise ClusterError("etcd not found (Debian package etcd-server)")
        client = f"http://127.0.0.1:{self._etcd_client_port}"
        peer = f"http://127.0.0.1:{self._etcd_peer_port}"
        argv = [
            str(etcd),
            "--name=default",
            f"--data-dir={self._etcd_dir / 'data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync",  # tmpfs and throwaway data: durability buys nothing
            "--logger=zap",
            "--log-level=warn",
            "--quota-backend-bytes=2147483648",
        ]
        self._etcd = Component("etcd", argv, self.workdir / "logs" / "etcd.log")
        self._etcd.start()
        self._wait_etcd_ready(self._etcd)

    def _start_apiserver(self) -> None:
        pki = self.workdir / "pki"
        argv = [
            str(self.bin_dir / "kube-apiserver"),
            f"--advertise-address={self.listen_address}",
            f"--bind-address={self.listen_address}",
            f"--secure-port={self._apiserver_port}",
            # 1.20 serves plain HTTP on 8080 unless told not to; 1.24 removed the flag.
            *(["--insecure-port=0"] if self.minor < 24 else []),
            f"--etcd-servers={self.etcd_url}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            *self._aggregation_flags(),
            *self._apiserver_flags(pki),
            "--profiling=false",
            "--v=1",
        ]
        self._apiserver = Component("kube-apiserver", argv, self.workdir / "logs" / "kube-apiserver.log")
        self._apiserver.start()
        self._wait_apiserver_ready(self._apiserver)

    def _apiserver_flags(self, pki: Path) -> list[str]:
        """The API server's flags for this kind of cluster (a control plane without nodes)."""
        return [
            # The "kubernetes" Endpoints may not hold a loopback address: the reconciler would
            # log a validation error every 10 s.
            "--endpoint-reconciler-type=none",
            f"--disable-admission-plugins={','.join(DISABLED_ADMISSION_PLUGINS)}",
        ]

    def _start_controller_manager(self) -> None:
        pki = self.workdir / "pki"
        argv = [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            # 1.20 also serves plain HTTP on 10252 unless told not to (the flag is gone since 1.24).
            *(["--port=0"] if self.minor < 24 else []),
            "--secure-port=0",  # no fixed 10257 port: several clusters run side by side
            "--leader-elect=false",
            f"--controllers={','.join(['*', *(f'-{name}' for name in self._controllers_off())])}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            *self._controller_manager_flags(),
            "--kube-api-qps=100",
            "--kube-api-burst=200",
            "--v=1",
        ]
        self._controller_manager = Component(
            "kube-controller-manager", argv, self.workdir / "logs" / "kube-controller-manager.log"
        )
        self._controller_manager.start()
        # The default service account appearing proves the controllers are running.
        self._wait(
            "kube-controller-manager (default service account)",
            self._controller_manager,
            lambda: self.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
        )

    def _controllers_off(self) -> list[str]:
        extra = DISABLED_CONTROLLERS_LEGACY if self.legacy else DISABLED_CONTROLLERS_CURRENT
        return [*DISABLED_CONTROLLERS, *extra]

    def _controller_manager_flags(self) -> list[str]:
        """The controller manager's flags for this kind of cluster (none beyond the common ones)."""
        return []

    def _wait_etcd_ready(self, comp: Component) -> None:
        def healthy() -> bool:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as resp:
                return bool(json.loads(resp.read()).get("health") in ("true", True))

        self._wait("etcd", comp, healthy)

    def _wait_apiserver_ready(self, comp: Component) -> None:
        self._wait(
            "kube-apiserver /readyz", comp, lambda: self.request("GET", "/readyz", timeout=5)[0] == 200
        )

    def _wait(self, what: str, comp: Component, probe: Callable[[], bool]) -> None:
        def ready() -> bool:
            if not comp.running():
                raise ClusterError(f"{comp.name} exited while waiting for {what}:\n{self.logs()}")
            return probe()

        polling.wait_for(
            what,
            ready,
            self.ready_timeout,
            0.1,
            ClusterError,
            retry_on=(OSError, ValueError),
            details=self.logs,
        )

    def _close_api(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None

    def serve_until_interrupted(self, hint: str = "") -> int:
        """``up``'s last step: export the kubeconfig, run until Ctrl-C or a component exits."""
        export = f"export KUBECONFIG={self.kubeconfig}"
        return serve_until_interrupted(export, lambda: self.running, self.logs, hint)

    def _stop_components(self) -> None:
        # Reverse start order: clients first, storage last.
        for attr, grace in (("_controller_manager", 5.0), ("_apiserver", _APISERVER_GRACE), ("_etcd", 10.0)):
            comp: Component | None = getattr(self, attr)
            if comp is not None:
                comp.stop(grace)
                setattr(self, attr, None)


def _cmd_up(args: argparse.Namespace) -> int:
    stop_on_ctrl_c()
    cluster = LocalCluster(args.dir, bin_dir=args.bin_dir, version=args.k8s)
    started = time.monotonic()
    with cluster:
        elapsed = time.monotonic() - started
        version = cluster.version
        print(f"# control plane {version} ready in {elapsed:.1f} s at {cluster.server}", file=sys.stderr)
        print(
            f"# logs: {cluster.workdir / 'logs'}; kubectl {version}: {cluster.bin_dir / 'kubectl'}",
            file=sys.stderr,
        )
        return cluster.serve_until_interrupted()


def _cmd_build(args: argparse.Namespace) -> int:
    print(ensure_binaries(args.bin_dir, args.k8s))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.cluster", description="A real local Kubernetes control plane."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster, print `export KUBECONFIG=...`, wait for Ctrl-C")
    up.add_argument(
        "--dir", type=Path, default=None, help="keep kubeconfig, keys and logs here (kept on exit)"
    )
    up.add_argument("--bin-dir", type=Path, default=None, help="binaries (default: the build cache)")
    up.set_defaults(func=_cmd_up)
    build = sub.add_parser("build", help="build or reuse the control-plane binaries; print their directory")
    build.add_argument("--bin-dir", type=Path, default=None)
    build.set_defaults(func=_cmd_build)
    for command in (up, build):
        command.add_argument(
            "--k8s",
            metavar="VERSION",
            default=None,
            help=f"'current' ({CURRENT_K8S_VERSION}), '1.20' ({LEGACY_K8S_VERSION}) or v1.Y.Z "
            f"(default: ${K8S_VERSION_ENV}, else current)",
        )
    return run_command(parser, argv, ClusterError)


if __name__ == "__main__":
    sys.exit(main())

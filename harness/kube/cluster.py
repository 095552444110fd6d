"""A real local Kubernetes control plane: etcd + kube-apiserver + kube-controller-manager.

:class:`LocalCluster` is composed, not subclassed: its binaries (:mod:`harness.kube.binaries`), its
keys (:mod:`harness.kube.pki`), its components' command lines (:mod:`harness.kube.components`) and a
:class:`~harness.kube.profile.Profile` that says what kind of cluster it serves: alone
(:class:`~harness.kube.profile.Standalone`, the default: everything on 127.0.0.1, on free ports, so
several clusters run side by side; no kubelet and no scheduler, tests act those out with
:mod:`harness.kube.kubelet`), or with real nodes (:class:`harness.node.cluster.RealNode` owns one).
The release is the caller's or ``MQBALANCE_K8S_VERSION`` (:mod:`harness.kube.versions`); the
binaries are built once by ``hack/build-control-plane.sh`` into a per-user cache (see
docs/local-cluster.md).

Command line::

    python -m harness.kube.cluster up [--dir DIR] [--k8s 1.20]   # start, print KUBECONFIG, wait for Ctrl-C
    python -m harness.kube.cluster build [--k8s 1.20]            # build or reuse the binaries
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

from harness import polling
from harness.kube.api import KubeApi
from harness.kube.binaries import Binaries, ControlPlaneBinaries, ensure_binaries, find_etcd
from harness.kube.components import apiserver_argv, controller_manager_argv, etcd_argv
from harness.kube.errors import ClusterError, KubectlError
from harness.kube.pki import Pki
from harness.kube.profile import BASE_SERVING_NAMES, Profile, Standalone, Versions
from harness.kube.versions import (
    CURRENT_K8S_VERSION,
    K8S_VERSION_ENV,
    LEGACY_K8S_VERSION,
    is_legacy,
    minor_of,
    resolve_version,
)
from harness.processes.command import run_command, serve_until_interrupted, stop_on_ctrl_c
from harness.processes.managed import Component
from harness.processes.net import free_port
from harness.processes.service import Service, forget, stop_at_exit
from harness.processes.workdir import WorkDir, owned_tempdir, sweep_stale_dirs

ADMIN_USER = "mqbalance-admin"
# On SIGTERM kube-apiserver closes its port at once but then waits up to 60 s for open
# watches to end; nothing here needs that drain.
_APISERVER_GRACE = 2.0
_STALE_PREFIXES = ("mqbalance-cluster-", "mqbalance-etcd-")


def kubeconfig_document(server: str, ca_file: Path, user: str, token: str) -> dict[str, Any]:
    """A kubeconfig for ``user`` with a bearer ``token``, the CA embedded (a copy keeps working)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "mqbalance-local",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_file.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": "mqbalance-local",
                "context": {"cluster": "mqbalance-local", "user": user, "namespace": "default"},
            }
        ],
        "current-context": "mqbalance-local",
    }


def _token_line(token: str, user: str, uid: str, groups: tuple[str, ...]) -> str:
    """A line of the API server's ``--token-auth-file``."""
    line = f"{token},{user},{uid}"
    return f'{line},"{",".join(groups)}"' if groups else line


CRD_NAMES = ("topics.mqbalance.io", "consumergroups.mqbalance.io", "offsetresets.mqbalance.io")
"""The project's CRDs (crds/), as the API server names them."""


class LocalCluster(Service):
    """etcd + kube-apiserver + kube-controller-manager, set up as ``profile`` says (default
    :class:`~harness.kube.profile.Standalone`: on 127.0.0.1, without nodes).

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Everything started is
    stopped by process group on :meth:`stop`, at interpreter exit, on SIGTERM/SIGHUP and on
    Ctrl-C (``at_exit=False``: not at exit, its owner stops it). Start it from a thread that
    outlives the cluster (normally the main thread): on Linux the components are told to exit when
    the starting thread dies.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        *,
        bin_dir: str | os.PathLike[str] | None = None,
        ready_timeout: float = 120.0,
        build: bool = True,
        version: str | None = None,
        controller_manager: bool = True,
        profile: Profile | None = None,
        binaries: Binaries | None = None,
        at_exit: bool = True,
    ) -> None:
        """Create (not start) a cluster.

        ``workdir`` holds certificates, the kubeconfig and component logs; a temporary one
        (removed on stop) is used when omitted. etcd's data always lives in its own tmpfs
        directory. ``build`` lets :meth:`start` run the build script when binaries are missing
        from ``bin_dir`` (default the cache); ``binaries`` replaces both. ``version`` picks the
        Kubernetes release (see :func:`~harness.kube.versions.resolve_version`); by default
        ``MQBALANCE_K8S_VERSION``, else the current release. ``controller_manager=False`` starts
        etcd and the API server only (no Deployments, garbage collection or namespace deletion).
        """
        self.version = resolve_version(version)
        self.minor = minor_of(self.version)
        self.profile: Profile = profile or Standalone()
        self._with_controller_manager = controller_manager
        self._binaries: Binaries = binaries or ControlPlaneBinaries(
            self.version,
            Path(bin_dir) if bin_dir is not None else None,
            build=build,
            controller_manager=controller_manager,
        )
        self._at_exit = at_exit
        self._workdir = WorkDir(workdir, "cluster", ClusterError)
        self._bin_dir: Path | None = None
        self.ready_timeout = ready_timeout
        self._token = secrets.token_hex(24)
        self._users = {user.name: (user, secrets.token_hex(16)) for user in self.profile.users()}
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

    def user_kubeconfig(self, user: str) -> Path:
        """Path of the kubeconfig of one of the profile's users."""
        return self.workdir / self._users[user][0].kubeconfig

    @property
    def listen_address(self) -> str:
        """Where the API server listens and what the kubeconfigs name."""
        return self.profile.listen_address

    @property
    def apiserver_port(self) -> int:
        return self._apiserver_port

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
    def pki(self) -> Pki:
        return Pki(self.workdir / "pki")

    @property
    def ca_file(self) -> Path:
        return self.pki.path("ca.crt")

    @property
    def bin_dir(self) -> Path:
        return self._bin_dir or self._binaries.directory

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

    def components(self) -> list[Component]:
        """The components running (or started and not stopped), in start order."""
        return [c for c in (self._etcd, self._apiserver, self._controller_manager) if c is not None]

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the running components, by name."""
        return {comp.name: comp.proc.pid for comp in self.components() if comp.proc is not None}

    @property
    def started(self) -> bool:
        """Started and not stopped (whether or not every component still runs)."""
        return self._apiserver is not None

    @property
    def apiserver_running(self) -> bool:
        return self._apiserver is not None and self._apiserver.running()

    @property
    def running(self) -> bool:
        components = [self._etcd, self._apiserver]
        if self._with_controller_manager:
            components.append(self._controller_manager)
        return all(c is not None and c.running() for c in components)

    # -- lifecycle ---------------------------------------------------------------------------

    def ensure_binaries(self) -> Path:
        self._bin_dir = self._binaries.ensure()
        return self._bin_dir

    def start(self) -> Self:
        with self._lock:
            if self.started:
                return self
            self.ensure_binaries()  # nothing to stop when this fails
            if self._at_exit:
                stop_at_exit(self)
            try:
                self._start_components()
            except BaseException:
                self.stop()
                raise
            return self

    def _start_components(self) -> None:
        """Everything this cluster runs, started in order; :meth:`start` stops it all on an error."""
        self._prepare_dirs()
        self.pki.write_control_plane([*BASE_SERVING_NAMES, *self.profile.serving_names()])
        self.profile.write_keys(self.pki)
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

    def stop_controller_manager(self, grace: float = 5.0) -> None:
        """Stop kube-controller-manager only (no more replacement pods, no more garbage collection)."""
        with self._lock:
            if self._controller_manager is not None:
                self._controller_manager.stop(grace)
                self._controller_manager = None

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
        """The harness's blocking client (:mod:`harness.kube.api`) as the admin of this cluster."""
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
        return "\n".join(f"--- {c.name} ({c.log}) ---\n{c.tail(lines)}" for c in self.components())

    def wait_ready(self, what: str, comp: Component, probe: Callable[[], bool]) -> None:
        """Until ``probe`` holds (within the cluster's ready timeout), failing at once when ``comp``
        exits; every component's log in the error."""
        comp.wait_ready(what, probe, self.ready_timeout, ClusterError, self.logs)

    def serve_until_interrupted(self, hint: str = "") -> int:
        """``up``'s last step: export the kubeconfig, run until Ctrl-C or a component exits."""
        export = f"export KUBECONFIG={self.kubeconfig}"
        return serve_until_interrupted(export, lambda: self.running, self.logs, hint)

    # -- internals ---------------------------------------------------------------------------

    def _prepare_dirs(self) -> None:
        sweep_stale_dirs(_STALE_PREFIXES)
        workdir = self._workdir.make(lambda: owned_tempdir("mqbalance-cluster-"))
        (workdir / "logs").mkdir(exist_ok=True)
        (workdir / "pki").mkdir(exist_ok=True)
        self._etcd_dir = owned_tempdir("mqbalance-etcd-")

    def _write_auth(self) -> None:
        lines = [_token_line(self._token, ADMIN_USER, ADMIN_USER, ("system:masters",))]
        lines += [_token_line(token, u.name, u.uid, u.groups) for u, token in self._users.values()]
        tokens = self.pki.path("tokens.csv")
        tokens.write_text("\n".join(lines) + "\n")
        tokens.chmod(0o600)

    def _pick_ports(self) -> None:
        self._etcd_client_port = free_port()
        self._etcd_peer_port = free_port()
        self._apiserver_port = free_port()
        self._close_api()

    def _write_kubeconfigs(self) -> None:
        users: list[tuple[Path, str, str]] = [(self.kubeconfig, ADMIN_USER, self._token)]
        users += [(self.workdir / u.kubeconfig, u.name, token) for u, token in self._users.values()]
        for path, user, token in users:
            # JSON is valid YAML, and every client (kubectl, the Python client, helm) reads it.
            document = kubeconfig_document(self.server, self.ca_file, user, token)
            path.write_text(json.dumps(document, indent=2) + "\n")
            path.chmod(0o600)

    def _start_etcd(self) -> None:
        etcd = find_etcd(self.bin_dir)
        if etcd is None or self._etcd_dir is None:
            raise ClusterError("etcd not found (Debian package etcd-server)")
        argv = etcd_argv(etcd, self._etcd_dir / "data", self._etcd_client_port, self._etcd_peer_port)
        self._etcd = Component("etcd", argv, self.workdir / "logs" / "etcd.log")
        self._etcd.start()
        self._wait_etcd_ready(self._etcd)

    def _start_apiserver(self) -> None:
        argv = apiserver_argv(
            self.bin_dir,
            self.minor,
            self.listen_address,
            self._apiserver_port,
            self.etcd_url,
            self.pki,
            self.profile.apiserver_flags(self.pki),
        )
        self._apiserver = Component("kube-apiserver", argv, self.workdir / "logs" / "kube-apiserver.log")
        self._apiserver.start()
        self._wait_apiserver_ready(self._apiserver)

    def _start_controller_manager(self) -> None:
        versions = Versions(self.minor, self.legacy, self.bin_dir)
        argv = controller_manager_argv(
            self.bin_dir,
            self.minor,
            self.kubeconfig,
            self.pki,
            self.profile.controllers_off(versions),
            self.profile.controller_manager_flags(),
        )
        log = self.workdir / "logs" / "kube-controller-manager.log"
        self._controller_manager = Component("kube-controller-manager", argv, log)
        self._controller_manager.start()
        # The default service account appearing proves the controllers are running.
        self.wait_ready(
            "kube-controller-manager (default service account)",
            self._controller_manager,
            lambda: self.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
        )

    def _wait_etcd_ready(self, comp: Component) -> None:
        def healthy() -> bool:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as resp:
                return bool(json.loads(resp.read()).get("health") in ("true", True))

        self.wait_ready("etcd", comp, healthy)

    def _wait_apiserver_ready(self, comp: Component) -> None:
        self.wait_ready(
            "kube-apiserver /readyz", comp, lambda: self.request("GET", "/readyz", timeout=5)[0] == 200
        )

    def _close_api(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None

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
        prog="python -m harness.kube.cluster", description="A real local Kubernetes control plane."
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

"""``mqbalance operator`` as a subprocess against a cluster: started, awaited healthy, its metrics
and journal read back."""

from __future__ import annotations

import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from harness.apps.argv import HasEnv, cluster_env, operator_argv
from harness.apps.metrics import parse_metric
from harness.polling import wait_for
from harness.processes.managed import ManagedProcess, ProcessExited
from harness.processes.net import free_port, http_ok
from mqbalance.journal import JournalRecord


class OperatorProcess(ManagedProcess):
    """``mqbalance operator`` serving ``namespaces``, its journal and log in ``workdir``."""

    def __init__(
        self,
        cluster: HasEnv,
        namespaces: list[str],
        workdir: Path,
        *extra: str,
        env: Mapping[str, str] | None = None,
        error: type[Exception] = ProcessExited,
    ) -> None:
        self.cluster = cluster
        self.namespaces = namespaces
        self.workdir = workdir
        self.extra = extra
        self.journal = workdir / "journal.jsonl"
        self.port = 0
        super().__init__("operator", [], env or cluster_env(cluster), workdir / "operator.log", error)

    def spawn(self) -> None:
        self.port = free_port()
        argv = ["--metrics-port", str(self.port), "--metrics-host", "127.0.0.1"]
        argv += ["--journal", str(self.journal), *self.extra]
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        self.argv = operator_argv(*argv)
        super().spawn()

    def start(self, timeout: float = 60) -> None:
        self.spawn()
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 60) -> None:
        wait_for("the operator's /healthz", self.healthy, timeout, error=self.error)

    def healthy(self) -> bool:
        self.check()
        try:
            return http_ok(f"http://127.0.0.1:{self.port}/healthz")
        except OSError:
            return False

    def metrics_text(self, *names: str) -> str:
        """The operator's /metrics, or only the series ``names`` (``name[]``) when given."""
        query = "?" + urllib.parse.urlencode([("name[]", n) for n in names]) if names else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics{query}", timeout=5) as r:
            return str(r.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
        return parse_metric(self.metrics_text(name), name, labels)

    def reconciles(self) -> int:
        """Reconciles finished (any result); 0 before the operator answers."""
        try:
            return int(self.metric("mqbalance_reconciles_total"))
        except OSError:
            return 0

    def journal_records(self) -> list[JournalRecord]:
        if not self.journal.exists():
            return []
        text = self.journal.read_text()
        # A record still without its newline is the one a killed operator was writing;
        # the next start drops it (mqbalance.operator.journal).
        complete = text[: text.rfind("\n") + 1]
        return [JournalRecord.decode(line) for line in complete.splitlines() if line.strip()]

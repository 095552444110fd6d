"""``kubectl mqbalance``: a consumer group's status, history and what-if, and pause and resume.

Installed with the wheel as ``kubectl-mqbalance``, so kubectl finds it on the PATH as a plugin
(krew's convention); it reads the kubeconfig as kubectl does (``--kubeconfig``, ``$KUBECONFIG``,
``~/.kube/config``; ``--context``; the context's namespace unless ``-n`` names one).

    kubectl mqbalance status orders -n shop
    kubectl mqbalance history orders -o json
    kubectl mqbalance what-if orders --strategy AVG
    kubectl mqbalance what-if orders --members 5
    kubectl mqbalance pause orders
    kubectl mqbalance resume orders
    kubectl mqbalance reset orders --to-time 2026-11-29T08:00:00Z
    kubectl mqbalance reset orders --to-latest --topic orders --yes

``reset`` creates an OffsetReset, shows its preview, asks before it approves it (``--yes``: it does
not ask) and follows it to its end; declined, the OffsetReset is deleted.

Exit status: 0, 1 when the API server refuses, the group cannot be shown or a reset failed (or was
declined), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

from mqbalance.contract import (
    API_VERSION,
    APPROVE_ANNOTATION,
    CONFIGMAP_KEY,
    CONSUMER_GROUPS,
    OFFSET_RESET_KIND,
    OFFSET_RESETS,
    AssignmentDocument,
    DocumentError,
    configmap_name,
    custom_path,
)
from mqbalance.kubectl.views import (
    ViewError,
    group_status,
    history_rows,
    history_text,
    reset_outcome_text,
    reset_preview_text,
    status_text,
    what_if,
    what_if_text,
)

PROG = "kubectl mqbalance"


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", help="the group's namespace (default: the context's)")
    common.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    common.add_argument("--context", help="the kubeconfig context (default: the current one)")
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")

    top = argparse.ArgumentParser(prog=PROG, description="Day-2 operations on mqbalance ConsumerGroups.")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary in (
        ("status", "members, zones, queues per member, lag and handover in progress"),
        ("history", "the last generations: when, why, members, queues moved, handover time"),
    ):
        sub = commands.add_parser(name, parents=[common, output], help=summary, description=summary)
        sub.add_argument("group", help="the ConsumerGroup resource's name")
    sub = commands.add_parser(
        "what-if",
        parents=[common, output],
        help="the moves another strategy or member count would cause now",
        description="The moves another strategy or member count would cause now, computed by the "
        "operator's own strategies from the assignment published now; nothing is changed.",
    )
    sub.add_argument("group", help="the ConsumerGroup resource's name")
    sub.add_argument(
        "--strategy", help="a strategy name (AVG, STICKY, ...) or a spec.strategy object as JSON"
    )
    sub.add_argument("--members", type=int, help="this many members instead of those published now")
    for name, summary in (
        ("pause", "every member gives up its queues through the group's handover (spec.paused: true)"),
        ("resume", "the group is assigned again (spec.paused: false)"),
    ):
        sub = commands.add_parser(name, parents=[common, output], help=summary, description=summary)
        sub.add_argument("group", help="the ConsumerGroup resource's name")
    sub = commands.add_parser(
        "reset",
        parents=[common, output],
        help="move the group's committed offsets: a preview, a confirmation, then the reset",
        description="Create an OffsetReset of the group, show its preview (each queue's committed offset "
        "and target), approve it once confirmed and follow it: the group is paused through its handover, "
        "its offsets checked against the preview, written, read back, and the group resumed.",
    )
    sub.add_argument("group", help="the ConsumerGroup resource's name")
    target = sub.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--to-time", metavar="RFC3339", help="each queue's first message at or after this time"
    )
    target.add_argument("--to-earliest", action="store_true", help="each queue's oldest message kept")
    target.add_argument("--to-latest", action="store_true", help="each queue's end: skip everything")
    target.add_argument("--from-group", metavar="GROUP", help="copy this ConsumerGroup's committed offsets")
    sub.add_argument("--topic", action="append", default=[], help="a Topic resource to reset (default: all)")
    sub.add_argument("--leave-paused", action="store_true", help="leave the group paused afterwards")
    sub.add_argument("--name", help="the OffsetReset's name (default: GROUP-reset-<time>)")
    sub.add_argument("-y", "--yes", action="store_true", help="approve without asking")
    sub.add_argument("--timeout", type=float, default=300.0, help="seconds to follow the reset (default 300)")
    return top


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    out = out or sys.stdout
    try:
        from mqbalance.kube import ApiError
    except ModuleNotFoundError as e:  # aiohttp or kubernetes missing
        print(f"{PROG}: needs {e.name}; install it with: pip install 'mqbalance[cli]'", file=sys.stderr)
        return 2
    try:
        shown = asyncio.run(run(args))
    except ViewError as e:
        print(f"{PROG} {args.command}: {e}", file=sys.stderr)
        return 1
    except ApiError as e:
        print(f"{PROG} {args.command}: {explain(e, args)}", file=sys.stderr)
        return 1
    print(render(args.command, args.output, shown), file=out)
    return 1 if args.command == "reset" and shown[0].get("phase") != "Succeeded" else 0


async def run(args: argparse.Namespace) -> tuple[Any, str]:
    """What to print: (data for -o json|yaml, text for the table)."""
    from mqbalance.kube import KubeClient, kubeconfig_namespace

    namespace = args.namespace or kubeconfig_namespace(args.kubeconfig, args.context)
    client = await KubeClient.connect(args.kubeconfig, requests=4, context=args.context)
    try:
        if args.command == "reset":
            return await reset(client, namespace, args)
        path = custom_path(CONSUMER_GROUPS, namespace, args.group)
        if args.command in ("pause", "resume"):
            paused = args.command == "pause"
            group = await client.merge_patch(path, {"spec": {"paused": paused}})
            view = group_status(group, None)
            what = "paused: its members give up their queues" if paused else "resumed: it is assigned again"
            return (
                view,
                f"consumergroup {namespace}/{args.group} {what}; see kubectl mqbalance status {args.group}",
            )
        group = await client.get(path)
        if args.command == "history":
            entries = history_rows(group)
            return entries, history_text(entries)
        document = await published(client, namespace, args.group)
        if args.command == "status":
            view = group_status(group, document)
            return view, status_text(view)
        if document is None:
            raise ViewError(
                f"{namespace}/{args.group} has no assignment published yet: nothing to compare with"
            )
        strategy = strategy_argument(args.strategy)
        if strategy is None and args.members is None:
            raise ViewError("say what to change: --strategy NAME and/or --members N")
        result = what_if(group, document, strategy, args.members)
        return result.to_json(), what_if_text(group, document, result)
    finally:
        await client.close()


async def reset(client: Any, namespace: str, args: argparse.Namespace) -> tuple[Any, str]:
    """Create the OffsetReset, show its preview, approve it once confirmed, follow it to its end."""
    await client.get(custom_path(CONSUMER_GROUPS, namespace, args.group))  # 404: say so before creating
    name = args.name or f"{args.group}-reset-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}"
    to: dict[str, Any]
    if args.to_time:
        to = {"time": args.to_time}
    elif args.from_group:
        to = {"fromGroup": args.from_group}
    else:
        to = {"position": "Earliest" if args.to_earliest else "Latest"}
    spec: dict[str, Any] = {"group": args.group, "to": to, "leavePaused": args.leave_paused}
    if args.topic:
        spec["topics"] = args.topic
    body = {"apiVersion": API_VERSION, "kind": OFFSET_RESET_KIND, "metadata": {"name": name}, "spec": spec}
    path = custom_path(OFFSET_RESETS, namespace)
    await client.create(path, body)
    path += f"/{name}"
    deadline = time.monotonic() + args.timeout
    status = await follow(client, path, ("Proposed", "Failed"), deadline)
    if status["phase"] == "Failed":
        return status, reset_outcome_text(name, status)
    print(reset_preview_text(name, status), file=sys.stderr if args.output != "table" else sys.stdout)
    if not args.yes and not confirm(f"Pause group {args.group} and apply this reset? [y/N] "):
        await client.delete(path)
        return {**status, "phase": "Declined"}, f"OffsetReset {name}: not applied, deleted"
    await client.merge_patch(path, {"metadata": {"annotations": {APPROVE_ANNOTATION: "true"}}})
    status = await follow(client, path, ("Succeeded", "Failed"), deadline, show=args.output == "table")
    return status, reset_outcome_text(name, status)


async def follow(
    client: Any, path: str, phases: Sequence[str], deadline: float, show: bool = False
) -> dict[str, Any]:
    """The OffsetReset's status once it reaches one of ``phases`` (each phase on the way shown)."""
    seen = None
    while True:
        status = dict((await client.get(path)).get("status") or {})
        phase = status.get("phase")
        if show and phase != seen and phase not in (None, "Proposed"):
            print(f"  {phase}", flush=True)
        seen = phase
        if phase in phases:
            return status
        if time.monotonic() > deadline:
            raise ViewError(
                f"the reset is still {phase or 'not taken up'} (is the operator running?); "
                f"see kubectl get offsetreset {path.rsplit('/', 1)[1]} -o yaml"
            )
        await asyncio.sleep(0.5)


def confirm(question: str) -> bool:
    try:
        return input(question).strip().lower() in ("y", "yes")
    except EOFError:  # no terminal: not confirmed
        return False


async def published(client: Any, namespace: str, group: str) -> AssignmentDocument | None:
    """The group's document as published now (None: none yet)."""
    from mqbalance.kube import ApiError

    try:
        configmap = await client.get(f"/api/v1/namespaces/{namespace}/configmaps/{configmap_name(group)}")
    except ApiError as e:
        if e.status == 404:
            return None
        raise
    text = (configmap.get("data") or {}).get(CONFIGMAP_KEY)
    if text is None:
        return None
    try:
        return AssignmentDocument.decode(text)
    except DocumentError as e:
        raise ViewError(f"the published assignment cannot be read: {e}") from None


def strategy_argument(value: str | None) -> dict[str, Any] | None:
    """``--strategy``: a bare name, or a spec.strategy object as JSON."""
    if value is None:
        return None
    if value.lstrip().startswith("{"):
        try:
            data = json.loads(value)
        except ValueError as e:
            raise ViewError(f"--strategy is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise ViewError("--strategy must be a name or a JSON object")
        return data
    return {"name": value.upper()}


def explain(error: Exception, args: argparse.Namespace) -> str:
    """The API server's refusal, with what to do about the usual ones."""
    status = getattr(error, "status", 0)
    where = f"consumergroup {args.group!r}" + (f" in namespace {args.namespace!r}" if args.namespace else "")
    if status == 404:
        return f"{where} not found (kubectl get consumergroups -A lists them)"
    if status == 403:
        return (
            f"{error} (ask for get, and patch for pause and resume, on consumergroups.mqbalance.io; "
            "for reset, create, get, patch and delete on offsetresets.mqbalance.io)"
        )
    if status == 409:
        return f"{error} (an OffsetReset of that name exists: choose another with --name)"
    if status == 0:
        return f"the API server did not answer: {error}"
    return str(error)


def render(command: str, output: str, shown: tuple[Any, str]) -> str:
    data, text = shown
    if output == "json":
        return json.dumps(data, indent=2, sort_keys=True)
    if output == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=True)).rstrip()
    return text


if __name__ == "__main__":
    sys.exit(main())

"""``gpu-admission evaluate``: the policy offline on files, like ``kyverno apply``/``gator test``.

Exit codes: 0 everything allowed, 1 anything denied, 2 unusable input (a message names the file,
the document and the field).

``-o json`` prints one JSON object per evaluated pod, one per line (JSON Lines)::

    {"file": str, "document": int (1-based object position; List items count),
     "kind": str, "name": str, "namespace": str,
     "template": str (dotted path of the pod template, "" for a Pod),
     "allowed": bool, "gpu": bool, "exempt": str, "workload": str|null,
     "workloadReason": str, "cudaVersion": str|null, "cudaSource": str,
     "violations": [{"rule", "path", "message", "mode"}], "warnings": [str],
     "patch": [RFC 6902 ops against the pod], "changes": [str]}

``-o yaml`` prints the same objects as a multi-document YAML stream, each with ``mutated``: the
object with every pod template's patch applied (denied pods are not patched).

``-o manifest`` prints every object read, in order, each with its pod templates' patches
applied (denied pods are not patched): a YAML stream ready for ``kubectl apply -f -``, as
``kyverno apply`` prints mutated resources. Denials and warnings go to stderr.

``-f`` takes files, ``-`` (stdin) and directories (their ``.json``/``.yaml``/``.yml`` files;
with ``-R`` their subdirectories' too), as ``kubectl apply -f`` does. KServe runtimes
(ServingRuntime, ClusterServingRuntime) anywhere in the input serve the InferenceServices;
``runtime`` (JSON/YAML) and a ``runtime:`` line (text) say which one a pod runs.

DRA (docs/dra.md): DeviceClasses, ResourceClaimTemplates and ResourceClaims in the files (and,
with ``--kubeconfig``, listed from a cluster) form the snapshot DRA pods are decided against; each
claim and template also gets a row of its own (the claim rule set, ``template`` "").

Nodes (docs/pools.md): ``kind: Node`` objects in the files (``kubectl get nodes -o yaml``) and,
with ``--kubeconfig`` (or ``--cluster``), the cluster's Nodes say which GPUs are shared (GPU
Feature Discovery's labels); without any, the policy's declared pools are assumed. Each GPU
pod's ``placement`` says which.

``--compiled`` (docs/compile.md): the same output, decided by evaluating the CEL of the
admission policies ``gpu-admission compile`` emits (``gpu_admission.compile.offline``).
"""

from __future__ import annotations

import dataclasses
import sys
import uuid
from pathlib import Path
from typing import Any, Final

import click
import orjson
import yaml

from gpu_admission.admission.engine import evaluate as evaluate_pod
from gpu_admission.cli.options import kubeconfig_option
from gpu_admission.core.decision import Decision, RequestFacts
from gpu_admission.core.patch import apply_ops
from gpu_admission.dra.model import DraSourceError
from gpu_admission.evaluate.dra import OfflineDra, is_compute_domain, is_dra_object
from gpu_admission.facts.nodepools import ASSUMED_POOLS, node_view
from gpu_admission.policy.model import Policy, PolicyError, default_policy, load_policy
from gpu_admission.rules.gpu_access import EPHEMERAL_SUBRESOURCE
from gpu_admission.workloads.files import InputError, expand_paths, read_documents
from gpu_admission.workloads.kinds import (
    PodTemplate,
    RuntimeCatalog,
    WorkloadError,
    pod_templates,
    skip_reason,
    with_mutated_template,
)


class _NoAliasDumper(yaml.SafeDumper):
    """Plain YAML for humans: repeat shared sub-objects instead of emitting &id anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


#: what a GPU pod decided by the compiled admission policies was placed against: the CEL
#: sees no Node, so the policy's declared pools (the engine says the same when it sees none)
COMPILED_PLACEMENT: Final = "compiled admission policies see no nodes: " + ASSUMED_POOLS

def offline_uid(name: str, index: int, pointer: str) -> str:
    """The request UID an offline evaluation uses (the API server sends a random UUID):
    stable per file, document and template, so the output is reproducible. It names a
    fractional pod's ConfigMap (``gpu-admission-gpu-<uid>``, docs/fractional.md)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpu-admission-evaluate:{name}#{index}{pointer}"))


def _result(name: str, index: int, obj: dict[str, Any], tpl: PodTemplate,
            decision: Decision) -> dict[str, Any]:
    meta = tpl.pod.get("metadata", {})
    obj_meta = obj.get("metadata") or {}
    return {
        "file": name, "document": index, "kind": obj.get("kind"),
        "name": obj_meta.get("name") or obj_meta.get("generateName", ""),
        "namespace": meta.get("namespace", ""), "template": tpl.field,
        "allowed": decision.allowed, "gpu": decision.gpu, "exempt": decision.exempt,
        "workload": decision.workload, "workloadReason": decision.workload_reason,
        "cudaVersion": decision.cuda_version, "cudaSource": decision.cuda_source,
        "violations": [v.as_dict() for v in decision.violations],
        "warnings": list(decision.warnings),
        "patch": [dict(op) for op in decision.patch],
        "changes": list(decision.changes),
        **({"runtime": tpl.runtime} if tpl.runtime else {}),
        **({"unread": list(tpl.notes)} if tpl.notes else {}),
        **({"hints": list(tpl.hints)} if tpl.hints else {}),
        "placement": decision.placement,
    }


def _text(result: dict[str, Any], label: str) -> str:
    verdict = "ALLOWED" if result["allowed"] else "DENIED"
    where = f"{result['file']} document {result['document']}"
    lines = [f"{label} ({where}): {verdict}"]
    if result["exempt"]:
        lines.append(f"  exempt: {result['exempt']}")
    if not result["gpu"]:
        # Only the GPU-access guard applies (NVIDIA_VISIBLE_DEVICES=void, its denials), and
        # the GPU-aware scheduler for CPU pods (spec.scheduling.cpuPods).
        if not (result["violations"] or result["patch"]):
            lines.append("  not a GPU pod: nothing to do")
            return "\n".join(lines)
        routed = "spec.schedulerName" in result["changes"]
        lines.append("  not a GPU pod: GPU-access guard"
                     + (" and the GPU-aware scheduler (spec.scheduling.cpuPods)" if routed
                        else " only"))
    else:
        if result.get("runtime"):
            lines.append(f"  runtime: {result['runtime']}")
        lines.append(f"  workload: {result['workload']} ({result['workloadReason']})")
        cuda = result["cudaVersion"] or "unknown"
        lines.append(f"  cuda: {cuda}"
                     + (f" ({result['cudaSource']})" if result["cudaSource"] else ""))
        if result["placement"]:
            lines.append(f"  placement: {result['placement']}")
    said = set()
    for v in result["violations"]:
        lines.append(f"  {v['mode']:<7} [{v['rule']}] {v['path']}: {v['message']}")
        said.add(f"{v['rule']}:")
    for w in result["warnings"]:  # a warn violation's warning is the line above: once
        if w.split(" ", 1)[0] not in said:
            lines.append(f"  warning: {w}")
    for note in result.get("unread", ()):
        lines.append(f"  unread: {note}")
    for hint in result.get("hints", ()):
        lines.append(f"  hint: {hint}")
    if result["patch"]:
        lines.append("  patch:")
        for op in result["patch"]:
            value = orjson.dumps(op.get("value")).decode() if "value" in op else ""
            lines.append(f"    {op['op']} {op['path']} {value}".rstrip())
    return "\n".join(lines)


def _cluster_nodes(source: str | None) -> list[Any]:
    """The cluster's Nodes, reduced to labels and GPU allocatable (``--kubeconfig``)."""
    if source is None:
        return []
    from gpu_admission.kube.nodes import (  # noqa: PLC0415 - kubernetes: slow
        NodeSourceError,
        list_nodes,
    )
    try:
        return list(list_nodes(source))
    except NodeSourceError as exc:
        raise InputError(f"--kubeconfig: {exc}") from None


def _debug_facts(pod: dict[str, Any]) -> dict[str, Any]:
    """``kubectl debug``: an UPDATE of pods/ephemeralcontainers adding the last ephemeral
    container; the ones before it are the pod's existing (immutable) ones."""
    spec = pod.get("spec")
    items = spec.get("ephemeralContainers") if isinstance(spec, dict) else None
    names = [c.get("name") for c in items if isinstance(c, dict)] if isinstance(items, list) \
        else []
    if not names:
        raise InputError(f"--debug-container: pod {pod['metadata'].get('name', '')!r} has no "
                         "spec.ephemeralContainers (the container kubectl debug adds)")
    return {"operation": "UPDATE", "sub_resource": EPHEMERAL_SUBRESOURCE,
            "existing_ephemeral": frozenset(n for n in names[:-1] if isinstance(n, str))}


@click.command(name="evaluate", short_help="Decide pods and workloads offline.")
@click.option("-f", "--filename", "filenames", multiple=True, required=True,
              metavar="FILE|DIR", help="YAML/JSON file (multi-document ok), directory (its "
                                       ".json/.yaml/.yml files), or '-' (stdin).")
@click.option("-R", "--recursive", is_flag=True,
              help="Read the subdirectories of -f directories too (as kubectl -R).")
@click.option("--policy", "policy_path", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="GPUSharingPolicy file (default: the built-in policy).")
@click.option("-n", "--namespace", default=None,
              help="Namespace of the request (default: the object's, else 'default').")
@click.option("--user", default="", help="Requesting user (for exemptions).")
@click.option("--group", "groups", multiple=True, help="Requesting user's group (repeatable).")
@click.option("--operation", type=click.Choice(["CREATE", "UPDATE"]), default="CREATE",
              show_default=True, help="Admission operation to simulate.")
@click.option("--stage", type=click.Choice(["mutate", "validate"]), default="mutate",
              show_default=True, help="mutate: the mutating webhook; validate: re-check only.")
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml", "manifest"]),
              default="text", show_default=True,
              help="manifest: the mutated objects as YAML for `kubectl apply -f -`.")
@kubeconfig_option("--cluster",
                   help="Also read this cluster (read only): its Nodes, to learn which GPUs "
                        "are shared (docs/pools.md), and its DeviceClasses, "
                        "ResourceClaimTemplates, ResourceClaims and the pods naming claims, to "
                        "decide DRA pods: a kubeconfig file or in-cluster.")
@click.option("--compiled", is_flag=True,
              help="Decide with the compiled admission policies (`gpu-admission compile`), "
                   "evaluated with cel-python, instead of the engine (docs/compile.md).")
@click.option("--debug-container", "ephemeral", is_flag=True,
              help="Simulate `kubectl debug`: each Pod is the UPDATE of pods/ephemeralcontainers "
                   "that adds its last ephemeral container (docs/guard.md).")
def evaluate(*, filenames: tuple[str, ...], recursive: bool, policy_path: Path | None,
             namespace: str | None,
             user: str, groups: tuple[str, ...], operation: str, stage: str,
             output: str, kubeconfig: str | None, compiled: bool, ephemeral: bool) -> None:
    """Evaluate Pods and workloads' pod templates offline against the GPU sharing policy.

    Exit code 0 when everything is allowed, 1 when anything is denied, 2 for unusable input.
    """
    try:
        policy: Policy = load_policy(policy_path) if policy_path else default_policy()
    except PolicyError as exc:
        raise InputError(f"policy: {exc}") from None
    compiled_policy = None
    if compiled:
        from gpu_admission.compile.compiler import (  # noqa: PLC0415 - lazy
            FractionalPoolsNeedWebhook,
        )
        from gpu_admission.compile.offline import CompiledEvaluator  # noqa: PLC0415 - lazy

        try:
            compiled_policy = CompiledEvaluator(policy)
        except FractionalPoolsNeedWebhook as exc:
            raise InputError(f"--compiled: {exc}") from None
        for rule in compiled_policy.stays:
            click.echo(f"compiled: rule {rule} stays with the webhook (its pods are decided "
                       "by the engine)", err=True)

    # Parse and check every input before printing anything, so exit 2 means "nothing evaluated".
    jobs: list[tuple[str, int, dict[str, Any], list[PodTemplate]]] = []
    every: list[tuple[str, int, Any]] = []  # every object read, in order (-o manifest)
    dra = OfflineDra()  # DeviceClasses, claims, templates: docs/dra.md
    if kubeconfig is not None:
        try:
            from gpu_admission.kube.dra import list_objects  # noqa: PLC0415 - kubernetes: slow

            dra.load_cluster(list_objects(kubeconfig))
        except DraSourceError as exc:
            raise InputError(f"--kubeconfig: {exc}") from None
    node_objects = _cluster_nodes(kubeconfig)
    for name in expand_paths(filenames, recursive):
        for index, doc in enumerate(read_documents(name), start=1):
            if isinstance(doc, dict) and doc.get("kind") == "Node":
                node_objects.append(doc)  # the cluster's shape, not a pod
                continue
            every.append((name, index, doc))
    catalog = RuntimeCatalog()  # KServe runtimes, for the InferenceServices of any file
    for _, _, doc in every:
        catalog.add(doc, namespace)
    for name, index, doc in every:
        try:
            if catalog.is_runtime(doc):
                click.echo(f"{name}: document {index}: {doc.get('kind')} read as a KServe "
                           "runtime: its pods are the InferenceServices' that select it",
                           err=True)
                continue
            if is_compute_domain(doc):
                if dra.add_compute_domain(doc, namespace):
                    click.echo(f"{name}: document {index}: ComputeDomain: its IMEX channel "
                               "ResourceClaimTemplate is read as the driver creates it (not a "
                               "GPU)", err=True)
                continue
            if is_dra_object(doc):
                claim = dra.take(doc, namespace)
                if claim is not None:
                    jobs.append((name, index, doc, [claim]))
                continue
            templates = pod_templates(doc, namespace, catalog)
            dra.add_pods(doc, templates)
        except WorkloadError as exc:
            kind = doc.get("kind") if isinstance(doc, dict) else None
            where = f"document {index} ({kind})" if isinstance(kind, str) and kind else (
                f"document {index}")
            raise InputError(f"{name}: {where}: {exc}") from None
        if templates:
            jobs.append((name, index, doc, templates))
        else:
            why = skip_reason(doc)
            click.echo(f"{name}: document {index}: skipped {doc.get('kind')} "
                       f"(no pod template{': ' + why if why else ''})", err=True)
    if not jobs:
        raise InputError("no Pod or workload with a pod template in the input")
    nodes = node_view(node_objects, policy, "Node objects given") if node_objects else None
    if compiled_policy is not None and node_objects:
        click.echo("compiled: the admission policies cannot see nodes; they use the declared "
                   "pools (docs/compile.md); the Node objects given are not used",
                   err=True)
    if ephemeral:  # every pod must name the container it adds, before anything is printed
        for _, _, _, templates in jobs:
            for tpl in templates:
                _debug_facts(tpl.pod)

    denied = False
    yaml_docs: list[dict[str, Any]] = []
    manifests: dict[tuple[str, int], Any] = {}
    for name, index, doc, templates in jobs:
        mutated = doc
        results = []
        for tpl in templates:
            request: dict[str, Any] = {"operation": operation}
            if ephemeral:
                request = _debug_facts(tpl.pod)
            facts = RequestFacts(namespace=tpl.pod["metadata"]["namespace"], user=user,
                                 groups=tuple(groups),
                                 stage="validate" if stage == "validate" else "mutate",
                                 uid=offline_uid(name, index, tpl.pointer or tpl.field),
                                 **request)
            if compiled_policy is not None and not dra.is_claim(tpl):
                decision = compiled_policy.decide(tpl.pod, facts, dra.snapshot_for(tpl))
                if decision.gpu and not decision.exempt:  # the CEL sees no Node (docs/compile.md)
                    decision = dataclasses.replace(decision, placement=COMPILED_PLACEMENT)
            else:
                decision = (dra.decide(tpl, facts, policy) if dra.is_claim(tpl)
                            else evaluate_pod(tpl.pod, facts, policy, dra.snapshot_for(tpl),
                                              nodes))
            denied = denied or not decision.allowed
            result = _result(name, index, doc, tpl, decision)
            results.append(result)
            if output in ("yaml", "manifest") and decision.patch and not dra.is_claim(tpl):
                mutated = with_mutated_template(mutated, tpl, apply_ops(tpl.pod, decision.patch))
            if output == "json":
                click.echo(orjson.dumps(result).decode())
            elif output == "text":
                click.echo(_text(result, tpl.label))
            elif output == "manifest" and (result["violations"] or result.get("unread")):
                click.echo(_text(result, tpl.label), err=True)  # stdout is the manifest
        if output == "yaml":
            for result in results:
                yaml_docs.append({**result, "mutated": mutated})
        manifests[name, index] = mutated
    if output == "yaml":
        click.echo(yaml.dump_all(yaml_docs, Dumper=_NoAliasDumper, sort_keys=False), nl=False)
    elif output == "manifest":
        objects = [manifests.get((name, index), doc) for name, index, doc in every]
        click.echo(yaml.dump_all(objects, Dumper=_NoAliasDumper, sort_keys=False), nl=False)
    sys.exit(1 if denied else 0)

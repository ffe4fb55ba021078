"""The README's security table ("What runs, and what it may do in the API") is true of what
the install applies (issue 33): the kustomize base (real ``kubectl kustomize``) and the Helm
chart's rendering (real Helm) each give exactly the Deployments it lists (replicas included),
the ServiceAccount of each workload, whether its token is mounted, and the RBAC verbs and
resources its bindings grant (and the built-in roles it is bound to by name). Its prose on
names and namespaces holds too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_admission.extender.binder import BindConfig, reservation_pod
from tests.chart_support import render_chart
from tests.install.test_manifests import render

README = Path(__file__).parents[2] / "README.md"
NS = "gpu-admission"
Docs = list[dict[str, Any]]


@dataclass(frozen=True)
class Row:
    """One line of the README's table."""

    runs: str  # the first cell as written
    kinds: tuple[tuple[str, str], ...]  # (kind, name) of the workloads the row names
    replicas: int | None
    account: str
    token: bool
    grants: frozenset[tuple[str, str]]  # (resource, verb)
    roles: frozenset[str]  # built-in roles bound by name ("kube-system/x" for a Role)


def ticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def parse_access(cell: str) -> tuple[frozenset[tuple[str, str]], frozenset[str]]:
    grants: set[tuple[str, str]] = set()
    roles: set[str] = set()
    for part in (p.strip() for p in cell.split(";")):
        if part.startswith(("ClusterRole ", "Role ")):
            roles.update(ticked(part))
            continue
        resources, _, verbs = part.partition(":")
        assert verbs, f"README: expected 'resources: verbs' in {part!r}"
        verbs = re.sub(r"\(.*?\)", "", verbs)
        grants |= {(r, v.strip()) for r in ticked(resources) for v in verbs.split(",")}
    return frozenset(grants), frozenset(roles)


def readme_rows() -> list[Row]:
    text = README.read_text()
    table = text.split("| Runs | ServiceAccount | Token | API access (RBAC) |\n", 1)[1]
    rows = []
    for line in table.splitlines()[1:]:
        if not line.startswith("|"):
            break
        runs, account, token, access = (c.strip() for c in line.strip("|").split("|"))
        kinds: list[tuple[str, str]] = []
        for kind in ("Deployment", "Job", "CronJob"):
            if re.search(rf"\b{kind}\b", runs):
                kinds.append((kind, ticked(runs)[0]))
        found = re.search(r"\((\d+) replicas?\)", runs)
        assert token in ("mounted", "not mounted"), token
        grants, roles = parse_access(access)
        rows.append(Row(runs, tuple(kinds), int(found[1]) if found else None,
                        ticked(account)[0], token == "mounted", grants, roles))
    return rows


# --- what the manifests say -------------------------------------------------------------

def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "CronJob":
        return dict(doc["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    if doc["kind"] == "Pod":
        return dict(doc["spec"])
    return dict(doc["spec"]["template"]["spec"])


def token_mounted(spec: dict[str, Any], docs: Docs) -> bool:
    """The kubelet's rule: the pod's automountServiceAccountToken, else the
    ServiceAccount's, else true."""
    if "automountServiceAccountToken" in spec:
        return bool(spec["automountServiceAccountToken"])
    account = next(d for d in docs if d["kind"] == "ServiceAccount"
                   and d["metadata"]["name"] == spec.get("serviceAccountName", "default"))
    return bool(account.get("automountServiceAccountToken", True))


def access_of(account: str, docs: Docs) -> tuple[frozenset[tuple[str, str]], frozenset[str]]:
    roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    grants: set[tuple[str, str]] = set()
    builtin: set[str] = set()
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s.get("kind") == "ServiceAccount" and s["name"] == account
                   and s.get("namespace", NS) == NS for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace", "") if ref["kind"] == "Role" else ""
        role = roles.get((ref["kind"], namespace, ref["name"]))
        if role is None:  # a built-in role, bound by name
            builtin.add(f"{namespace}/{ref['name']}" if namespace else ref["name"])
            continue
        for rule in role["rules"]:
            grants |= {(r, v) for r in rule["resources"] for v in rule["verbs"]}
    return frozenset(grants), frozenset(builtin)


def workloads(docs: Docs) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Deployment", "Job", "CronJob")]


def reservation(docs: Docs) -> dict[str, Any]:
    """The reservation pod as the extender creates it (started with the Deployment's
    arguments: its namespace and the default ServiceAccount)."""
    return reservation_pod("r", "node", BindConfig(namespace=NS, image="x"), "ns/p")


# --- the checks ---------------------------------------------------------------------------

def rendered(source: str) -> Docs:
    return render("base") if source == "kustomize" else render_chart()


@pytest.fixture(params=["kustomize", "helm"])
def docs(request: pytest.FixtureRequest) -> Docs:
    return rendered(str(request.param))


def test_the_table_names_every_deployment_and_job_with_its_replicas(docs: Docs) -> None:
    rows = readme_rows()
    listed = {kind: row for row in rows for kind in row.kinds}
    installed = {(d["kind"], d["metadata"]["name"]): d for d in workloads(docs)}
    assert set(listed) == set(installed)
    for key, doc in installed.items():
        if key[0] == "Deployment":
            assert listed[key].replicas == doc["spec"]["replicas"], key


def test_each_rows_account_token_and_rbac_are_the_manifests(docs: Docs) -> None:
    installed = {(d["kind"], d["metadata"]["name"]): d for d in workloads(docs)}
    for row in readme_rows():
        specs = ([pod_spec(installed[k]) for k in row.kinds] if row.kinds
                 else [pod_spec(reservation(docs))])
        for spec in specs:
            assert spec["serviceAccountName"] == row.account, row.runs
            assert token_mounted(spec, docs) is row.token, row.runs
        assert access_of(row.account, docs) == (row.grants, row.roles), row.runs


def test_no_other_service_account_has_rbac(docs: Docs) -> None:
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    listed = {row.account for row in readme_rows()}
    assert accounts == listed


def _rules(docs: Docs) -> Iterable[tuple[dict[str, Any], dict[str, Any]]]:
    for role in (d for d in docs if d["kind"] in ("Role", "ClusterRole")):
        for rule in role["rules"]:
            yield role, rule


def test_the_prose_on_names_and_namespaces(docs: Docs) -> None:
    text = " ".join(README.read_text().split())
    assert ("Roles are confined to namespace `gpu-admission` (Secrets, Leases, reservation "
            "pods), except kube-scheduler's read of "
            "`kube-system/extension-apiserver-authentication-reader`") in text
    for role, rule in _rules(docs):
        if role["kind"] == "Role":
            assert role["metadata"]["namespace"] == NS
            assert set(rule["resources"]) <= {"secrets", "leases", "pods"}
        narrow = {"get", "update", "patch"} & set(rule["verbs"])
        if narrow and set(rule["resources"]) & {"secrets", "leases",
                                                "mutatingwebhookconfigurations"}:
            assert rule.get("resourceNames"), (role["metadata"]["name"], rule)
    bound = [b for b in docs if b["kind"] == "RoleBinding"
             and b["metadata"]["namespace"] != NS]
    assert [(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in bound] == [
        ("kube-system", "extension-apiserver-authentication-reader")]


def test_the_chart_and_the_base_agree_on_the_table() -> None:
    """Both sources give the same answers (each row is checked against both above)."""
    base, chart = rendered("kustomize"), rendered("helm")
    for row in readme_rows():
        assert access_of(row.account, base) == access_of(row.account, chart), row.runs


def test_the_readme_is_a_front_door() -> None:
    """Under 250 lines; the two commands first (Python 3.11+, a virtual environment); Helm
    before kustomize; every page of docs/ in its map."""
    text = README.read_text()
    assert len(text.splitlines()) < 250
    assert text.index("python3 -m venv .venv && . .venv/bin/activate") < text.index(
        "gpu-admission serve") < text.index("python3 -m pytest") < text.index(
        "## Install on a cluster")
    assert "Python 3.11 or newer" in text
    assert text.index("**With Helm**") < text.index("**With kustomize**")
    pages = {p.name for p in (README.parent / "docs").glob("*.md")}
    mapped = set(re.findall(r"\| \[docs/([a-z-]+\.md)\]", text.split("## Documentation")[1]))
    assert mapped == pages

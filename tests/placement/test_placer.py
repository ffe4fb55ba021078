"""Issue 32: the fractional ranking keeps no process-wide state (project rule: state passed
explicitly). What it learns lives in a :class:`Placer` its owner holds (one per extender
app, one per benchmark or test)."""

from __future__ import annotations

import numpy as np

from gpu_admission.placement import fractional
from gpu_admission.placement.fractional import (
    DictSource,
    LedgerSource,
    Placer,
    Registry,
    filter_fractional,
    rank_share,
    score_fractional,
)
from gpu_admission.placement.frag import Workload
from gpu_admission.placement.ledger import Assignment, Ledger
from gpu_admission.placement.requests import NodeRequests
from gpu_admission.policy.model import Policy, policy_from_dict
from tests.extender.fractional_support import NAMESPACE, POOL_LABEL, frac_node

CARD = 81920  # MiB


def policy() -> Policy:
    return policy_from_dict({"apiVersion": "gpu-admission.io/v1alpha1",
                             "kind": "GPUSharingPolicy", "spec": {"nodePools": [{
                                 "name": "frac", "nodeSelector": {POOL_LABEL: "frac"},
                                 "sharing": "fractional", "memoryMiB": CARD}]}})


def test_the_module_holds_no_mutable_state() -> None:
    """No dict, list, set, workload or node registry at module level: a second extender in
    the same process (tests, the simulator) cannot see the first one's."""
    mutable = (dict, list, set, Workload, Registry, Placer)
    found = [name for name, value in vars(fractional).items()
             if isinstance(value, mutable) and not name.startswith("__")]
    assert found == []


def test_what_one_placer_learns_stays_in_it() -> None:
    a, b = Placer(), Placer()
    before = b.typical()
    for _ in range(600):  # past two refreshes
        a.observe(60000, CARD, (2000, 4096))
    learned, fresh = a.typical(), b.typical()
    assert fresh is before  # b saw nothing: its shapes were never re-read
    assert learned.weight.max() > fresh.weight.max()  # one shape dominates a's workload
    assert np.array_equal(fresh.milli, Placer().typical().milli)  # b is still the prior


def test_pool_lookup_follows_a_replaced_labels_object() -> None:
    """The pool cache is per placer and keyed by node name with the labels object's
    identity: the watch replaces the object when labels change, and the lookup follows."""
    placer, pol = Placer(), policy()
    inside = {POOL_LABEL: "frac"}
    assert placer.pool("n1", inside, pol) is not None
    assert placer.pool("n1", {POOL_LABEL: "other"}, pol) is None
    assert placer.pool("n1", inside, pol) is not None


def test_two_placers_rank_the_same_state_alike_until_one_learns() -> None:
    """Filter and prioritize through a placer: same answer from two fresh placers (the
    prior), and each keeps its own node arrays."""
    ledger = Ledger(NAMESPACE)
    nodes = [frac_node(f"n{i}", gpus=2) for i in range(3)]
    ledger.replace_nodes(nodes)
    names = [n["metadata"]["name"] for n in nodes]
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    views = {n: ledger.view(n) for n in names}
    pol = policy()
    a, b = Placer(), Placer()
    fa = filter_fractional(16384, names, views, labels, pol, placer=a)
    fb = filter_fractional(16384, names, views, labels, pol, placer=b)
    assert fa.passed == fb.passed == names
    sa = score_fractional(16384, names, views, labels, pol, placer=a, snapshot=None)
    sb = score_fractional(16384, names, views, labels, pol, placer=b, snapshot=None)
    assert sa == sb
    assert a.registry.nodes is not None and b.registry.nodes is not None
    assert a.registry.nodes is not b.registry.nodes


def test_prioritize_after_filter_reuses_the_ranking_and_a_change_invalidates_it() -> None:
    """The second ranking of the same pod on unchanged arrays is the first one's (no
    recomputation: same arrays, the memo kept), equal to a placer that never reuses; once a
    node changes (a share assumed on it), the ranking is computed again and differs."""
    ledger = Ledger(NAMESPACE)
    nodes = [frac_node(f"n{i}", gpus=2) for i in range(4)]
    ledger.replace_nodes(nodes)
    names = [n["metadata"]["name"] for n in nodes]
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    pol = policy()
    reuse, fresh = Placer(), Placer(reuse=False)

    def scores(placer: Placer, subset: list[str]) -> list[tuple[str, int]]:
        views = {n: ledger.view(n) for n in subset}
        return score_fractional(30000, subset, views, labels, pol, placer=placer,
                                snapshot=None, resources=dict.fromkeys(subset, (64000, 262144)))

    views = {n: ledger.view(n) for n in names}
    filter_fractional(30000, names, views, labels, pol, placer=reuse,
                      resources=dict.fromkeys(names, (64000, 262144)))
    memo = reuse.last
    assert memo is not None
    subset = names[1:]
    assert scores(reuse, subset) == scores(fresh, subset)
    assert reuse.last is memo  # reused, not recomputed
    ledger.assume(Assignment("t", "p", "u", "n2", ledger.open_gpu("r", "n2"), 30000))
    after = scores(reuse, subset)
    assert reuse.last is not memo
    assert after == scores(fresh, subset)


def test_the_watch_source_rereads_only_the_nodes_that_changed() -> None:
    """The extender's requests read rows through :class:`LedgerSource`: the ledger and the
    CPU/memory accounting say which nodes changed, only those rows are rewritten (the
    others keep the very objects they were built from), and the ranking equals one computed
    from scratch over per-request dicts."""
    ledger = Ledger(NAMESPACE)
    nodes = [frac_node(f"n{i}", gpus=2) for i in range(4)]
    for n in nodes:
        n["status"]["allocatable"].update({"cpu": "64", "memory": "256Gi"})
    ledger.replace_nodes(nodes)
    objs = {n["metadata"]["name"]: n for n in nodes}
    requests = NodeRequests()
    names = list(objs)
    pol = policy()
    placer = Placer()
    source = LedgerSource(ledger, objs, requests)
    req = placer.request(names, source, pol)
    assert req.card.tolist() == [CARD] * 4
    keys = list(placer.registry.keys)
    ledger.assume(Assignment("t", "p", "u", "n2", ledger.open_gpu("r", "n2"), 30000))
    requests.set_pod({"metadata": {"name": "cpu", "namespace": "t"},
                      "spec": {"nodeName": "n3", "containers": [{"resources": {
                          "requests": {"cpu": "60", "memory": "1Gi"}}}]},
                      "status": {"phase": "Running"}})
    req = placer.request(names, source, pol)
    after = placer.registry.keys
    assert [after[i] is keys[i] for i in range(4)] == [True, True, False, True]
    nodes_ = placer.registry.nodes
    assert nodes_ is not None and int(nodes_.cpu[req.rows[3]]) == 4000
    got = rank_share(placer, req, 20000, pol.spec.placement, (8000, 16384))
    fresh = Placer()
    views = {n: ledger.view(n) for n in names}
    labels = {n: objs[n]["metadata"]["labels"] for n in names}
    resources = {n: requests.free(objs[n]) for n in names}
    ref_req = fresh.request(names, DictSource(views, labels, resources, names), pol)
    ref = rank_share(fresh, ref_req, 20000, pol.spec.placement, (8000, 16384))
    assert got.rows.tolist() == ref.rows.tolist()
    assert np.allclose(got.delta, ref.delta) and got.card.tolist() == ref.card.tolist()
    ledger.replace_pods([])  # a relist: every row is read again when named
    assert source.changed() is None


def test_a_new_node_with_more_cards_widens_the_arrays() -> None:
    """A request naming a node the placer has not seen adds a row (read at once), one with
    more cards than any before widens every row; the ranking equals a fresh placer's."""
    ledger = Ledger(NAMESPACE)
    nodes = [frac_node("n0", gpus=1), frac_node("n1", gpus=2)]
    ledger.replace_nodes(nodes)
    objs = {n["metadata"]["name"]: n for n in nodes}
    pol = policy()
    placer = Placer()
    source = LedgerSource(ledger, objs, None)
    placer.request(["n0", "n1"], source, pol)
    big = frac_node("n2", gpus=8)
    objs["n2"] = big
    ledger.set_node(big)
    names = ["n2", "n0", "n1"]
    req = placer.request(names, source, pol)
    nodes_ = placer.registry.nodes
    assert nodes_ is not None and nodes_.gpu.shape[1] == 8
    assert (nodes_.gpu[req.rows] >= 0).sum(axis=1).tolist() == [8, 1, 2]
    got = rank_share(placer, req, 20000, pol.spec.placement)
    fresh = Placer()
    views = {n: ledger.view(n) for n in names}
    labels = {n: objs[n]["metadata"]["labels"] for n in names}
    ref_req = fresh.request(names, DictSource(views, labels, None, names), pol)
    ref = rank_share(fresh, ref_req, 20000, pol.spec.placement)
    a, b = np.argsort(got.rows), np.argsort(ref.rows)  # positions, in registry row order
    assert got.rows[a].tolist() == ref.rows[b].tolist()
    assert np.allclose(got.delta[a], ref.delta[b]) and got.card[a].tolist() == ref.card[b].tolist()

"""Never twice (issue 36): whatever order the watch events (the reservation's UUID, a pod's
ConfigMap, its binding), the binds and the binder's ``resolve()`` arrive in, the memory the
ledger offers on a card is its size minus every share promised on it.

The deterministic reproducer is the window the issue names: the watch delivers a new
reservation pod's ``gpu-admission.io/gpu-uuid`` while the shares promised on it still sit on
``opening:<reservation>`` (the opening bind resumes and calls ``resolve()`` later). Then the
interleaving test drives the ledger through every order of two binds and the UUID
publication, checking the invariant after every step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpu_admission.core.vocab import GPU_CONFIGMAP_ANNOTATION, GPU_UUID_ANNOTATION
from gpu_admission.extender.binder import BindConfig, configmap, reservation_pod
from gpu_admission.placement.fractional import NEW_GPU, choose
from gpu_admission.placement.ledger import OPENING_PREFIX, Assignment, Ledger, NodeView
from gpu_admission.policy.model import Placement
from tests.extender.fractional_support import NAMESPACE, TENANT, frac_node, frac_pod

CARD = 81920  # MiB, A100 80GB
HEADROOM = 1024  # MiB
PLACEMENT = Placement.model_validate({"memoryHeadroomMiB": HEADROOM})
NODE = "n1"
UUID = "GPU-n1-0"  # what the reservation publishes
A_SHARE, B_SHARE = 50000, 28000  # MiB: both fit one card (78000 + headroom < 81920)


# --- builders -------------------------------------------------------------------------------

def reservation(name: str, uuid: str = "") -> dict[str, Any]:
    """The reservation pod as the watch shows it (bound by nodeName; UUID once published)."""
    pod = reservation_pod(name, NODE, BindConfig(NAMESPACE, "img"), f"{TENANT}/x")
    pod["metadata"]["uid"] = f"uid-{name}"
    if uuid:
        pod["metadata"]["annotations"][GPU_UUID_ANNOTATION] = uuid
        pod["status"] = {"phase": "Running"}
    return pod


def pod(name: str, share: int, *, bound_to: str = "") -> dict[str, Any]:
    out = frac_pod(name, share)
    out["metadata"]["uid"] = f"uid-{name}"
    if bound_to:
        out["spec"] = {**out["spec"], "nodeName": bound_to}
        out["status"] = {"phase": "Running"}
    return out


def cm_of(p: dict[str, Any], uuid: str) -> dict[str, Any]:
    meta = p["metadata"]
    return configmap(meta["namespace"], meta["annotations"][GPU_CONFIGMAP_ANNOTATION],
                     meta["name"], meta["uid"], uuid)


def ledger(gpus: int = 2) -> Ledger:
    out = Ledger(NAMESPACE)
    out.replace_nodes([frac_node(NODE, gpus=gpus)])
    out.replace_configmaps([])
    out.replace_pods([])
    return out


def bind_start(led: Ledger, p: dict[str, Any], share: int, reservation_name: str) -> str:
    """What the binder does synchronously when a bind starts: choose the GPU on the node's
    view, open one when it is new, record the share. Returns the GPU id chosen."""
    choice = choose(led.view(NODE), CARD, share, PLACEMENT)
    assert choice is not None, f"{p['metadata']['name']} fits nowhere"
    gpu_id = choice.gpu_id
    if gpu_id == NEW_GPU:
        gpu_id = led.open_gpu(reservation_name, NODE)
    meta = p["metadata"]
    led.assume(Assignment(meta["namespace"], meta["name"], meta["uid"], NODE, gpu_id, share))
    return gpu_id


# --- the reproducer -----------------------------------------------------------------------

def test_the_uuid_published_before_resolve_still_shows_the_shares_on_the_card() -> None:
    """Open a GPU, assume two shares on it, deliver the reservation pod with its UUID, view
    the node, choose: the card must show both shares, once, and a 40 GiB pod must not fit
    on it (on main the view showed the card empty next to an orphan ``opening:r1``)."""
    led = ledger()
    gpu = led.open_gpu("r1", NODE)
    led.assume(Assignment(TENANT, "a", "uid-a", NODE, gpu, 30000))
    led.assume(Assignment(TENANT, "b", "uid-b", NODE, gpu, 30000))
    led.set_pod(reservation("r1"))  # ADDED, no UUID yet
    led.set_pod(reservation("r1", UUID))  # MODIFIED: the UUID; resolve() not called yet
    view = led.view(NODE)
    assert [(g.gpu_id, g.used_mib, g.pods, g.reservation) for g in view.open] == [
        (UUID, 60000, 2, "r1")]
    assert view.free_whole == 1
    choice = choose(view, CARD, 40000, PLACEMENT)
    assert choice is not None and choice.gpu_id == NEW_GPU  # not the card with 60000 MiB


# --- every interleaving -------------------------------------------------------------------

@dataclass
class World:
    """The ledger under test, and the truth the test keeps beside it: which physical card
    each started bind's share is promised on (``opening:r1`` and the UUID it publishes are
    the same card)."""

    led: Ledger = field(default_factory=ledger)
    a: dict[str, Any] = field(default_factory=lambda: pod("a", A_SHARE))
    b: dict[str, Any] = field(default_factory=lambda: pod("b", B_SHARE))
    promised: dict[str, tuple[str, int]] = field(default_factory=dict)  # pod -> (card, MiB)
    opened: dict[str, str] = field(default_factory=dict)  # reservation -> its card
    published: bool = False

    def card(self, gpu_id: str) -> str:
        if gpu_id.startswith(OPENING_PREFIX):
            name = gpu_id[len(OPENING_PREFIX):]
            return self.opened.setdefault(name, UUID if name == "r1" else f"card-{name}")
        return gpu_id


def _a_start(w: World) -> None:
    gpu = bind_start(w.led, w.a, A_SHARE, "r1")
    assert gpu == OPENING_PREFIX + "r1"  # the node is empty: a opens the first card
    w.promised["a"] = (w.card(gpu), A_SHARE)


def _b_start(w: World) -> None:
    gpu = bind_start(w.led, w.b, B_SHARE, "r2")
    w.promised["b"] = (w.card(gpu), B_SHARE)


def _r_added(w: World) -> None:
    w.led.set_pod(reservation("r1"))


def _r_uuid(w: World) -> None:
    w.led.set_pod(reservation("r1", UUID))
    w.published = True


def _a_resolve(w: World) -> None:
    w.led.resolve("r1", UUID)


def _cm(name: str) -> Callable[[World], None]:
    def step(w: World) -> None:
        p = w.a if name == "a" else w.b
        w.led.set_configmap(cm_of(p, w.promised[name][0]))
    return step


def _bound(name: str) -> Callable[[World], None]:
    def step(w: World) -> None:
        w.led.set_pod(pod(name, A_SHARE if name == "a" else B_SHARE, bound_to=NODE))
    return step


STEPS: dict[str, Callable[[World], None]] = {
    "a_start": _a_start, "b_start": _b_start, "r_added": _r_added, "r_uuid": _r_uuid,
    "a_resolve": _a_resolve, "a_cm": _cm("a"), "a_bound": _bound("a"), "b_cm": _cm("b"),
    "b_bound": _bound("b")}

#: (before, after): what causality imposes. The reservation exists once a's bind created it
#: and publishes after it is seen; the binder resolves after the publication wakes it; a bind
#: writes its ConfigMap and binding once it knows its card's UUID (b's only needs the
#: publication when it joined r1, but requiring it always keeps the table static and still
#: covers b before and after it). The ConfigMap and binding events come on two watches, so
#: either may be seen first.
BEFORE = [("a_start", "b_start"), ("a_start", "r_added"), ("r_added", "r_uuid"),
          ("r_uuid", "a_resolve"), ("a_resolve", "a_cm"), ("a_resolve", "a_bound"),
          ("b_start", "b_cm"), ("b_start", "b_bound"), ("r_uuid", "b_cm"),
          ("r_uuid", "b_bound")]


def orders() -> list[tuple[str, ...]]:
    out = []
    for order in itertools.permutations(STEPS):
        at = {s: i for i, s in enumerate(order)}
        if all(at[x] < at[y] for x, y in BEFORE):
            out.append(order)
    return out


def check(w: World, after: str) -> None:
    """The invariant: each physical card appears once in the node's view, with exactly the
    shares promised on it; the whole GPUs left are the others; no choice offers memory a
    card does not have."""
    view: NodeView = w.led.view(NODE)
    cards = [w.card(g.gpu_id) for g in view.open]
    assert len(cards) == len(set(cards)), f"after {after}: a card listed twice: {view.open}"
    truth: dict[str, int] = {}
    for card, mib in w.promised.values():
        truth[card] = truth.get(card, 0) + mib
    shown = {w.card(g.gpu_id): g.used_mib for g in view.open}
    assert {c: m for c, m in shown.items() if m} == truth, f"after {after}: {view.open}"
    opened = {w.card(g) for g in [OPENING_PREFIX + r for r in w.opened]} | set(truth)
    assert view.free_whole == 2 - len(opened), f"after {after}: {view}"
    for probe in (2000, 4000, 30000, 52000, 80000):
        choice = choose(view, CARD, probe, PLACEMENT)
        if choice is not None and choice.gpu_id != NEW_GPU:
            free = CARD - truth.get(w.card(choice.gpu_id), 0)
            assert free >= probe + HEADROOM, f"after {after}: {probe} MiB offered on {choice}"


ORDERS = orders()


def test_the_orders_cover_the_window() -> None:
    """The enumeration holds the reproducer's order and b choosing before and after the
    publication (so both the opening id and the UUID are exercised)."""
    assert len(ORDERS) > 100
    for needle in [("a_start", "b_start", "r_added", "r_uuid", "a_resolve"),
                   ("a_start", "r_added", "r_uuid", "b_start", "a_resolve")]:
        assert any(o[:5] == needle for o in ORDERS)


@pytest.mark.parametrize("chunk", range(4), ids=lambda i: f"quarter-{i}")
def test_every_interleaving_of_two_binds_and_the_publication(chunk: int) -> None:
    for order in ORDERS[chunk::4]:
        w = World()
        for step in order:
            STEPS[step](w)
            check(w, f"{step} in {order}")
        # settled: both bound and placed, nothing left assumed, a card shared by both
        assert w.led.assumed == {}
        assert w.led.usage() == {NODE: {UUID: A_SHARE + B_SHARE}}


# --- an opening that fails ------------------------------------------------------------------

@dataclass
class Failing(World):
    """a opens r1 and b may join it; r1 never reports in time, so a's bind closes it (its
    shares, b's too, are dropped) while its pod may still publish the UUID before the
    watch shows it deleted. After the close the card must never be offered again."""

    done: set[str] = field(default_factory=set)


def _a_close(w: World) -> None:
    w.led.close_opening("r1")  # what the binder's _close does when the wait times out
    w.promised = {k: v for k, v in w.promised.items() if v[0] != UUID}


def _r_deleted(w: World) -> None:
    w.led.remove_pod(reservation("r1", UUID if w.published else ""))


FAIL_STEPS: dict[str, Callable[[World], None]] = {
    "a_start": _a_start, "b_start": _b_start, "r_added": _r_added, "a_close": _a_close,
    "r_uuid": _r_uuid, "r_deleted": _r_deleted}
FAIL_BEFORE = [("a_start", "b_start"), ("a_start", "r_added"), ("r_added", "r_uuid"),
               ("a_start", "a_close"), ("a_close", "r_deleted"), ("r_added", "r_deleted"),
               ("r_uuid", "r_deleted")]


def fail_orders() -> list[tuple[str, ...]]:
    out = []
    for order in itertools.permutations(FAIL_STEPS):
        at = {s: i for i, s in enumerate(order)}
        if all(at[x] < at[y] for x, y in FAIL_BEFORE):
            out.append(order)
    return out


def check_failing(w: Failing, after: str) -> None:
    view = w.led.view(NODE)
    cards = [w.card(g.gpu_id) for g in view.open]
    assert len(cards) == len(set(cards)), f"after {after}: a card listed twice: {view.open}"
    if "a_close" in w.done:
        assert UUID not in cards, f"after {after}: the closed card is offered: {view.open}"
    truth: dict[str, int] = {}
    for card, mib in w.promised.values():
        truth[card] = truth.get(card, 0) + mib
    shown = {w.card(g.gpu_id): g.used_mib for g in view.open}
    assert {c: m for c, m in shown.items() if m} == truth, f"after {after}: {view.open}"
    r1_holds = (("a_close" not in w.done) or
                ("r_added" in w.done and "r_deleted" not in w.done))
    held = int(r1_holds) + int("r2" in w.opened)
    assert view.free_whole == 2 - held, f"after {after}: {view}"
    for probe in (2000, 30000, 52000, 80000):
        choice = choose(view, CARD, probe, PLACEMENT)
        if choice is not None and choice.gpu_id != NEW_GPU:
            assert w.card(choice.gpu_id) != UUID or "a_close" not in w.done, after
            free = CARD - truth.get(w.card(choice.gpu_id), 0)
            assert free >= probe + HEADROOM, f"after {after}: {probe} MiB offered on {choice}"


def test_a_failed_opening_never_offers_its_card_again() -> None:
    """Every order of the opener's close, b's bind, and the reservation's added, late UUID
    and deleted events (on main a UUID published after the close reopened the card)."""
    orders = fail_orders()
    assert len(orders) == 15  # r_deleted always last; the rest in every causal order
    for order in orders:
        w = Failing()
        for step in order:
            FAIL_STEPS[step](w)
            w.done.add(step)
            check_failing(w, f"{step} in {order}")

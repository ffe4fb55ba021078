"""Unit tests of the wire layer: Go durations, deadlines, warnings, response encoding."""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest

from gpu_admission.server.app import deadline_seconds
from gpu_admission.server.config import ServerConfig
from gpu_admission.server.wire import (
    V1BETA1,
    WireError,
    encode_response,
    parse_go_duration,
    parse_review,
    sanitize_warnings,
)
from tests.builders import make_pod, make_review


@pytest.mark.parametrize(("text", "seconds"), [
    ("10s", 10.0), ("1m30s", 90.0), ("1.5s", 1.5), ("500ms", 0.5), ("2m", 120.0),
    ("1h", 3600.0), ("250us", 0.00025), ("", None), ("10", None), ("s", None),
    ("10x", None), ("-5s", None), ("10s5", None), ("1e3s", None),
], ids=repr)
def test_go_durations(text: str, seconds: float | None) -> None:
    assert parse_go_duration(text) == (pytest.approx(seconds) if seconds is not None else None)


@pytest.mark.parametrize(("param", "expected"), [
    ("10s", 9.0),  # default webhook timeout: answer a second early
    ("30s", 29.0),
    ("1s", 0.5),  # never less than half of what is left
    (None, 9.0),  # no ?timeout=: the configured default (10 s) minus the margin
    ("garbage", 9.0),
    ("0s", 9.0),
], ids=["10s", "30s", "1s", "absent", "garbage", "zero"])
def test_deadline_from_the_timeout_parameter(param: str | None, expected: float) -> None:
    config = ServerConfig(cert_file=Path("c"), key_file=Path("k"))
    assert deadline_seconds(param, config) == pytest.approx(expected)


def test_warnings_follow_the_kubernetes_rules() -> None:
    long = "y" * 300
    assert sanitize_warnings(["Warning: drop the prefix", "two\nlines\tand tabs",
                              "dup", "dup", "", "   ", long]) == [
        "drop the prefix", "two lines and tabs", "dup", "y" * 255 + "…"]


def test_response_omits_patch_when_empty_and_encodes_it_otherwise() -> None:
    plain = orjson.loads(encode_response(V1BETA1, "u", allowed=True))
    assert plain == {"apiVersion": V1BETA1, "kind": "AdmissionReview",
                     "response": {"uid": "u", "allowed": True}}
    ops = [{"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"}]
    doc = orjson.loads(encode_response("admission.k8s.io/v1", "u", allowed=True, patch=ops,
                                       warnings=["w"], audit_annotations={"decision": "allowed"}))
    response = doc["response"]
    assert orjson.loads(base64.b64decode(response.pop("patch"))) == ops
    assert response == {"uid": "u", "allowed": True, "patchType": "JSONPatch",
                        "warnings": ["w"], "auditAnnotations": {"decision": "allowed"}}


def test_parse_review_reads_the_request_facts() -> None:
    review = parse_review(orjson.dumps(make_review(
        make_pod(namespace="ml"), uid="abc", user="bob", groups=["g1", "g2"], dry_run=True)))
    assert (review.uid, review.namespace, review.operation, review.user, review.groups,
            review.dry_run, review.is_pod) == ("abc", "ml", "CREATE", "bob", ("g1", "g2"),
                                               True, True)
    facts = review.facts("mutate")
    assert (facts.namespace, facts.dry_run, facts.stage) == ("ml", True, "mutate")


def test_namespace_falls_back_to_the_object() -> None:
    doc = make_review(make_pod(namespace="ml"))
    del doc["request"]["namespace"]
    assert parse_review(orjson.dumps(doc)).facts("validate").namespace == "ml"


@pytest.mark.parametrize("quantity", ["1", 1, 2.5, "500m", "1Gi", "1e3", "100M"],
                         ids=repr)
def test_every_quantity_format_is_well_formed(quantity: object) -> None:
    pod = make_pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = quantity
    parse_review(orjson.dumps(make_review(pod)))  # no WireError


def test_wire_error_is_a_value_error_with_the_field() -> None:
    with pytest.raises(WireError, match=r"^request\.kind must be an object"):
        parse_review(b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1",'
                     b'"request":{"uid":"u"}}')

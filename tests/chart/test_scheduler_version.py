"""The chart's kube-scheduler (Deployment ``gpu-aware-scheduler``) follows the cluster's own
version, as Helm reports it (``.Capabilities.KubeVersion``: ``helm install`` asks the API
server, ``helm template --kube-version`` says it), unless ``scheduler.image.tag`` is set
(issue 33: a fixed v1.36.2 is an unsupported skew on a 1.30 cluster). Real Helm renders it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart_support import render_chart


def scheduler_image(values: dict[str, Any] | None, kube_version: str) -> str:
    docs = render_chart(values, kube_version=kube_version)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"
                     and d["metadata"]["name"] == "gpu-aware-scheduler"]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    return str(containers["kube-scheduler"]["image"])


@pytest.mark.parametrize(("kube_version", "image"), [
    pytest.param("v1.30.14", "registry.k8s.io/kube-scheduler:v1.30.14", id="1.30"),
    pytest.param("v1.34.2", "registry.k8s.io/kube-scheduler:v1.34.2", id="1.34"),
    pytest.param("v1.31.4-eks-2d5f260", "registry.k8s.io/kube-scheduler:v1.31.4", id="eks"),
    pytest.param("v1.33.5+k3s1", "registry.k8s.io/kube-scheduler:v1.33.5", id="k3s"),
])
def test_the_scheduler_image_is_the_clusters_version(kube_version: str, image: str) -> None:
    assert scheduler_image(None, kube_version) == image


def test_a_set_tag_wins_on_any_cluster() -> None:
    pinned = {"scheduler": {"image": {"tag": "v1.30.2"}}}
    for kube_version in ("v1.30.14", "v1.36.0"):
        assert scheduler_image(pinned, kube_version) == "registry.k8s.io/kube-scheduler:v1.30.2"

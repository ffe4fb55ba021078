"""The DRA cache watches the resource.k8s.io version the API server serves (discovery: v1,
else v1beta2, else v1beta1), hands the objects on unchanged, and ``/readyz`` names the
version (issue 22, cache part)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dra.objects import POLICY_YAML, cluster
from tests.dra.test_cache import readyz
from tests.kube_api_support import running_api
from tests.server_support import SecretDir, make_config, new_bundle, poll_until, running_server

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("served, watched", [
    (["v1", "v1beta2", "v1beta1"], "v1"),
    (["v1beta2", "v1beta1"], "v1beta2"),
    (["v1beta1"], "v1beta1"),
    ([], "none"),
], ids=["1.34+", "1.33", "1.32", "no-dra"])
async def test_the_served_version_is_watched_and_reported(tmp_path: Path, served: list[str],
                                                          watched: str) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY_YAML)
    secret = SecretDir(tmp_path / "certs", new_bundle())
    async with running_api(tmp_path) as (api, kubeconfig):
        api.dra_versions = served
        objects = cluster()
        api.apply(*objects)
        cfg = make_config(secret, policy_path=tmp_path / "policy.yaml",
                          dra_source=str(kubeconfig))
        async with running_server(cfg, secret.bundles[0].ca_pem) as server:
            dra = server.state.dra
            assert dra is not None
            await poll_until(lambda: dra.synced, within=20)
            status, body = await readyz(server)
            expected = "none" if watched == "none" else f"resource.k8s.io/{watched}"
            assert (status, body["dra"]) == (200, {"apiVersion": expected})
            paths = {p for p, _ in api.requests if p.startswith("/apis/resource.k8s.io/")}
            if watched == "none":
                assert paths == set()
            else:
                assert paths == {f"/apis/resource.k8s.io/{watched}/{r}" for r in
                                 ("deviceclasses", "resourceclaimtemplates", "resourceclaims")}
                # handed on unchanged: the snapshot holds the objects as served
                await poll_until(lambda: api.count("resourceclaims", watch=True) >= 1)
                served_claims = [o for o in objects if o["kind"] == "ResourceClaim"]
                snapshot = dra.snapshot()
                assert len(snapshot.claims) == len(served_claims)

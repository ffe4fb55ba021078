"""The bare baseline: the least an aiohttp webhook over TLS can do per AdmissionReview.

It parses the body with the same JSON library as the real server (orjson) and answers
``allowed: true`` with the same uid, in the apiVersion it was asked in. No policy, no patch,
no audit log, no metrics. The benchmark divides the real server's figures by this one's,
measured in the same run on the same core, so the ratio says what our own code costs.

Run: ``python benchmarks/baseline_server.py --cert-dir DIR --port N``.
"""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import orjson
from aiohttp import web


async def _review(request: web.Request) -> web.Response:
    body = orjson.loads(await request.read())
    answer = {"apiVersion": body.get("apiVersion", "admission.k8s.io/v1"),
              "kind": "AdmissionReview",
              "response": {"uid": body["request"]["uid"], "allowed": True}}
    return web.Response(body=orjson.dumps(answer), content_type="application/json")


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app() -> web.Application:
    """The baseline app: /mutate, /validate, /healthz."""
    app = web.Application(client_max_size=8 * 2**20)  # 8 MiB, like a webhook must accept
    app.router.add_post("/mutate", _review)
    app.router.add_post("/validate", _review)
    app.router.add_get("/healthz", _healthz)
    return app


def tls_context(cert_dir: Path) -> ssl.SSLContext:
    """TLS 1.2+ server context with Python's default (modern) cipher list."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")
    return ctx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert-dir", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(make_app(), host=args.host, port=args.port, ssl_context=tls_context(args.cert_dir),
                access_log=None, print=None)


if __name__ == "__main__":
    main()

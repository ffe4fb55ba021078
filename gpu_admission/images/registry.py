"""The OCI distribution API client (wire layer of ``images scan``), on aiohttp.

Spec: https://github.com/opencontainers/distribution-spec/blob/main/spec.md (pull:
``GET /v2/<name>/manifests/<reference>`` with ``Accept``, ``GET /v2/<name>/blobs/<digest>``)
and the token flow of https://distribution.github.io/distribution/spec/auth/token/: a ``401``
with ``WWW-Authenticate: Bearer realm="...",service="...",scope="..."`` is answered by
``GET <realm>?service=...&scope=...`` (with the user's basic credentials when there are any),
whose JSON ``token`` (or ``access_token``) is then sent as ``Authorization: Bearer``. A
``401`` with ``WWW-Authenticate: Basic`` is retried with basic credentials.

Credentials come from the docker CLI's config file, ``$DOCKER_CONFIG/config.json`` or
``~/.docker/config.json``: ``auths.<host>.auth`` (base64 ``user:password``) or
``auths.<host>.username``/``password``. Credential helpers (``credsStore``, ``credHelpers``)
are not run. Docker Hub's key is ``https://index.docker.io/v1/``.

Every body is bounded (:data:`MAX_MANIFEST_BYTES`, :data:`MAX_CONFIG_BYTES`) and checked
against its digest, so a registry cannot feed the scanner something else than it asked for.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp

from gpu_admission.images.scan import (
    DOCKER_HUB_API,
    DOCKER_LIST,
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_MANIFEST,
    ScanError,
)

ACCEPT: Final = ", ".join((OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST))
MAX_MANIFEST_BYTES: Final = 4 * 1024 * 1024  # the distribution spec's suggested manifest cap
MAX_CONFIG_BYTES: Final = 16 * 1024 * 1024
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
_HUB_KEYS: Final = ("https://index.docker.io/v1/", "index.docker.io", "docker.io",
                    DOCKER_HUB_API)


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str


def _host_of(key: str) -> str:
    host = key.split("://", 1)[-1].split("/", 1)[0]
    return DOCKER_HUB_API if host in ("index.docker.io", "docker.io") else host


def load_docker_credentials(environ: Mapping[str, str] | None = None) -> dict[str, Credentials]:
    """``host -> Credentials`` from the docker config file; ``{}`` when there is none."""
    env = os.environ if environ is None else environ
    directory = Path(env["DOCKER_CONFIG"]) if env.get("DOCKER_CONFIG") else (
        Path(env.get("HOME", str(Path.home()))) / ".docker")
    path = directory / "config.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ScanError(f"{path}: cannot read the docker config: {exc}") from None
    auths = doc.get("auths") if isinstance(doc, dict) else None
    if not isinstance(auths, dict):
        return {}
    out: dict[str, Credentials] = {}
    for key, entry in auths.items():
        if not isinstance(entry, dict):
            continue
        user, password = entry.get("username"), entry.get("password")
        if isinstance(entry.get("auth"), str) and entry["auth"]:
            try:
                user, _, password = base64.b64decode(entry["auth"], validate=True).decode(
                    "utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise ScanError(f"{path}: auths.{key}.auth is not base64 of user:password") \
                    from None
        if isinstance(user, str) and isinstance(password, str) and user:
            out[_host_of(str(key))] = Credentials(user, password)
    return out


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(_CHALLENGE_PARAM.findall(rest))


async def _read_bounded(response: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    if response.content_length is not None and response.content_length > limit:
        raise ScanError(f"{what} is {response.content_length} bytes, over the {limit} limit")
    body = bytearray()
    async for chunk in response.content.iter_chunked(65536):
        body += chunk
        if len(body) > limit:
            raise ScanError(f"{what} is over the {limit} byte limit")
    return bytes(body)


def _check_digest(body: bytes, digest: str, what: str) -> None:
    algorithm, _, expected = digest.partition(":")
    if algorithm != "sha256" or hashlib.sha256(body).hexdigest() != expected:
        raise ScanError(f"{what}: content does not match digest {digest}")


class RegistryClient:
    """Anonymous or authenticated pulls of manifests and config blobs (one session)."""

    def __init__(self, session: aiohttp.ClientSession, *, insecure: bool = False,
                 credentials: Mapping[str, Credentials] | None = None) -> None:
        self._session = session
        self._scheme = "http" if insecure else "https"
        self._credentials = dict(credentials or {})
        self._auth: dict[tuple[str, str], str] = {}  # (host, name) -> Authorization value

    async def _get(self, host: str, name: str, path: str, *, accept: str, limit: int,
                   what: str) -> tuple[bytes, Mapping[str, str]]:
        url = f"{self._scheme}://{host}/v2/{name}/{path}"
        for attempt in range(2):
            headers = {"Accept": accept}
            if (host, name) in self._auth:
                headers["Authorization"] = self._auth[(host, name)]
            try:
                async with self._session.get(url, headers=headers) as response:
                    if response.status == 401 and attempt == 0:
                        await self._authenticate(host, name, response.headers)
                        continue
                    if response.status == 401:
                        raise ScanError(f"{host}: access to {name} denied with the credentials "
                                        "given (docker login, ~/.docker/config.json)")
                    if response.status == 404:
                        raise ScanError(f"{what}: not found on {host} ({name})")
                    if response.status != 200:
                        raise ScanError(f"{what}: {host} answered HTTP {response.status}")
                    body = await _read_bounded(response, limit, what)
                    return body, response.headers
            except aiohttp.ClientError as exc:
                raise ScanError(f"{host}: cannot reach the registry ({self._scheme}): "
                                f"{exc.__class__.__name__}: {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def _authenticate(self, host: str, name: str, headers: Mapping[str, str]) -> None:
        header = headers.get("WWW-Authenticate", "")
        scheme, params = _challenge(header)
        creds = self._credentials.get(host)
        if scheme == "basic":
            if creds is None:
                raise ScanError(f"{host}: authentication required (basic) and no credentials "
                                f"for {host} in the docker config")
            token = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
            self._auth[(host, name)] = f"Basic {token}"
            return
        if scheme != "bearer" or "realm" not in params:
            raise ScanError(f"{host}: unsupported authentication challenge {header[:80]!r}")
        query = {"scope": params.get("scope", f"repository:{name}:pull")}
        if "service" in params:
            query["service"] = params["service"]
        auth = aiohttp.BasicAuth(creds.username, creds.password) if creds else None
        try:
            async with self._session.get(params["realm"], params=query, auth=auth) as response:
                if response.status != 200:
                    raise ScanError(f"{host}: token service {params['realm']} answered HTTP "
                                    f"{response.status}" + ("" if creds else
                                                           " (no credentials in the docker "
                                                           "config)"))
                doc: Any = json.loads(await _read_bounded(response, 1024 * 1024, "token"))
        except aiohttp.ClientError as exc:
            raise ScanError(f"{host}: cannot reach the token service {params['realm']}: "
                            f"{exc}") from None
        except ValueError:
            raise ScanError(f"{host}: token service answered something that is not JSON") \
                from None
        found = (doc.get("token") or doc.get("access_token")) if isinstance(doc, dict) else None
        if not isinstance(found, str) or not found:
            raise ScanError(f"{host}: token service answered without a token")
        self._auth[(host, name)] = f"Bearer {found}"

    async def manifest(self, host: str, name: str, reference: str) -> tuple[str, str, bytes]:
        """``(media type, digest, body)`` of a manifest or index by tag or digest."""
        what = f"{host}/{name}:{reference}" if not reference.startswith("sha256:") else (
            f"{host}/{name}@{reference}")
        body, headers = await self._get(host, name, f"manifests/{reference}", accept=ACCEPT,
                                        limit=MAX_MANIFEST_BYTES, what=what)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:"):
            _check_digest(body, reference, what)
        media = str(headers.get("Content-Type", "")).split(";", 1)[0].strip()
        return media, digest, body

    async def blob(self, host: str, name: str, digest: str) -> bytes:
        what = f"{host}/{name} blob {digest[:19]}"
        body, _ = await self._get(host, name, f"blobs/{digest}", accept="*/*",
                                  limit=MAX_CONFIG_BYTES, what=what)
        _check_digest(body, digest, what)
        return body

"""``gpu-admission audit`` reads what ``gpu-admission serve`` writes (issue 33): the real
server in a subprocess, reviews over HTTPS, then its own output piped to ``audit summary``.

* ``--audit-log -`` (as in-cluster): stdout and stderr together, as ``kubectl logs`` shows
  them, are decisions and the server's JSON log lines; the log lines are skipped and counted,
  never "bad"; a damaged decision line in the same stream still is.
* a shell's process substitution ``<(…)`` (``/dev/fd/N``, a pipe) is a readable input.
* a local ``serve`` with no ``--audit-log`` writes ``./gpu-admission-decisions.jsonl`` and
  names it in its first log lines; inside a pod the default is stdout.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gpu_admission.certs.bundle import write_bundle
from tests.builders import make_container, make_pod, make_review
from tests.server_support import SERVICE_HOST, free_port, new_bundle, poll_until, subprocess_env

GPU_ENV_DENIED = [{"name": "GPU_MEMORY_FRACTION", "value": "0.9"}]
REVIEWS = [  # (uid, pod): a CPU pod, a GPU pod, and one the built-in policy answers otherwise
    ("cpu", make_pod("cpu", containers=[make_container(gpu=None)])),
    ("gpu", make_pod("gpu")),
    ("gpu-env", make_pod("gpu-env", containers=[make_container(env=GPU_ENV_DENIED)])),
]
AUDIT = [sys.executable, "-m", "gpu_admission", "audit"]


def serve(args: list[str], cwd: Path, out: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``serve`` with stdout and stderr in one file, the way ``kubectl logs`` shows a pod."""
    with out.open("wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "gpu_admission", "serve", *args],
                                cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT)


async def review_all(port: int, ctx: ssl.SSLContext | None, proc: subprocess.Popen[bytes],
                     hostname: str | None) -> list[dict[str, Any]]:
    """Wait for /readyz, send every review in REVIEWS, return the responses."""
    answers = []
    async with asyncio.timeout(60), aiohttp.ClientSession() as session:
        while True:
            assert proc.poll() is None, f"server exited with {proc.returncode}"
            try:
                async with session.get(f"https://127.0.0.1:{port}/readyz", ssl=ctx or False,
                                       server_hostname=hostname) as resp:
                    if resp.status == 200:
                        break
            except (aiohttp.ClientError, OSError):
                pass
            await asyncio.sleep(0.1)
        for uid, pod in REVIEWS:
            async with session.post(f"https://127.0.0.1:{port}/mutate", ssl=ctx or False,
                                    server_hostname=hostname,
                                    data=orjson.dumps(make_review(pod, uid=uid)),
                                    headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 200
                answers.append((await resp.json())["response"])
    proc.send_signal(signal.SIGTERM)
    await poll_until(lambda: proc.poll() is not None, within=20)
    assert proc.returncode == 0
    return answers


def summary(*inputs: str, stdin: bytes | None = None, shell: bool = False) -> dict[str, Any]:
    args = [*AUDIT, "summary", "-o", "json", *inputs]
    command: list[str] | str = args
    if shell:  # bash, for <(…)
        command = ["bash", "-c", " ".join(shlex.quote(a) if not a.startswith("<(") else a
                                          for a in args)]
    done = subprocess.run(command, input=stdin, capture_output=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert b"Traceback" not in done.stderr
    result: dict[str, Any] = orjson.loads(done.stdout)
    return result


@pytest.fixture
def mixed_stream(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """The server's own output with ``--audit-log -``: decisions and log lines mixed."""
    write_bundle(new_bundle(), tmp_path / "certs")
    port = free_port()
    out = tmp_path / "pod.log"
    proc = serve(["--cert-dir", str(tmp_path / "certs"), "--port", str(port),
                  "--metrics-port", "0", "--audit-log", "-", "--shutdown-delay", "0"],
                 tmp_path, out, subprocess_env())
    try:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
        answers = asyncio.run(review_all(port, ctx, proc, SERVICE_HOST))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return out, answers


def test_the_servers_mixed_output_piped_to_summary_has_no_bad_line(
        mixed_stream: tuple[Path, list[dict[str, Any]]]) -> None:
    out, answers = mixed_stream
    lines = out.read_bytes().splitlines()
    log_lines = [line for line in lines if b'"schemaVersion"' not in line]
    assert len(log_lines) >= 4  # server_started, listening, one line per review, stopped...
    got = summary("-", stdin=out.read_bytes())
    assert got["input"]["badLines"] == 0, got["input"]["badSamples"]
    assert got["input"]["logLines"] == len(log_lines)
    assert got["total"] == len(REVIEWS) == len(answers)
    denied = sum(not a["allowed"] for a in answers)
    assert got["byDecision"].get("denied", {}).get("total", 0) == denied


def test_a_damaged_decision_line_in_the_stream_is_still_bad(
        mixed_stream: tuple[Path, list[dict[str, Any]]]) -> None:
    out, _ = mixed_stream
    record = next(line for line in out.read_bytes().splitlines() if b"schemaVersion" in line)
    damaged = out.read_bytes() + record[: len(record) // 2] + b"\n"
    got = summary("-", stdin=damaged)
    assert (got["total"], got["input"]["badLines"]) == (len(REVIEWS), 1)
    assert "invalid JSON" in got["input"]["badSamples"][0]


def test_process_substitution_is_a_readable_input(
        mixed_stream: tuple[Path, list[dict[str, Any]]]) -> None:
    out, _ = mixed_stream
    got = summary(f"<(cat {shlex.quote(str(out))})", shell=True)
    assert got["input"]["files"] == 1
    assert (got["total"], got["input"]["badLines"]) == (len(REVIEWS), 0)


def test_a_named_pipe_is_a_readable_input(tmp_path: Path) -> None:
    fifo = tmp_path / "decisions.fifo"
    os.mkfifo(fifo)
    record = orjson.dumps({"schemaVersion": 1, "time": "2026-12-01T10:00:00Z", "uid": "u1",
                           "decision": "allowed"})
    writer = subprocess.Popen(["sh", "-c", f'printf "%s\\n" "$1" > {shlex.quote(str(fifo))}',
                               "sh", record.decode()])
    try:
        got = summary(str(fifo))
    finally:
        writer.wait(timeout=30)
    assert (got["total"], got["input"]["badLines"]) == (1, 0)


@pytest.mark.parametrize(("in_pod", "expected"), [
    (False, "file"),
    (True, "stdout"),
], ids=["local-writes-a-named-file", "in-a-pod-writes-stdout"])
def test_serve_writes_a_decision_log_by_default(tmp_path: Path, in_pod: bool,
                                                expected: str) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {k: v for k, v in subprocess_env().items() if k != "KUBERNETES_SERVICE_HOST"}
    if in_pod:
        env["KUBERNETES_SERVICE_HOST"] = "10.96.0.1"
    port = free_port()
    out = tmp_path / "serve.log"
    proc = serve(["--port", str(port), "--metrics-port", "0", "--shutdown-delay", "0"],
                 workdir, out, env)
    try:
        asyncio.run(review_all(port, None, proc, None))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    logged = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    named = next(line for line in logged if line.get("event") == "decision_log")
    default = workdir / "gpu-admission-decisions.jsonl"
    if expected == "file":
        assert named["path"] == str(default)
        assert default.stat().st_size > 0
        assert logged.index(named) < 3  # among the first lines, before any review
        assert summary(str(default))["total"] == len(REVIEWS)
        assert not any("schemaVersion" in line for line in logged)
    else:
        assert named["path"] == "-"
        assert not default.exists()
        assert sum("schemaVersion" in line for line in logged) == len(REVIEWS)


def test_an_unwritable_default_decision_log_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "gpu-admission-decisions.jsonl").mkdir()  # the default path is taken
    env = {k: v for k, v in subprocess_env().items() if k != "KUBERNETES_SERVICE_HOST"}
    done = subprocess.run([sys.executable, "-m", "gpu_admission", "serve", "--port", "0",
                           "--metrics-port", "0"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"Error: cannot write the default decision log {tmp_path}/gpu-admission-decisions.jsonl"
        ": Is a directory; pass --audit-log FILE, - (stdout) or off")

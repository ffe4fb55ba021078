"""Serving engines that size their own GPU memory, recognised from a container (issue 33).

Why: vLLM, SGLang, TGI and TensorRT-LLM pre-allocate a fraction of the card chosen by their
own setting and read none of the variables rule ``memory-limit`` writes; two vLLM pods on
one time-sliced card at vLLM's default 0.9 and the second fails at start. So a container
recognised as one of them gets that setting sized to its share (rules/memory.py). Facts,
with sources, in docs/serving-engines.md:

========== ================================= ======= ====================================
engine     setting (what we write first)     default what the fraction is of
========== ================================= ======= ====================================
vLLM       ``--gpu-memory-utilization``      0.9     the GPU's total memory, per instance
SGLang     ``--mem-fraction-static``         auto    the GPU's memory, weights + KV pool
TGI        ``--cuda-memory-fraction`` /      1.0     the visible memory
           env ``CUDA_MEMORY_FRACTION``
TRT-LLM    ``--kv_cache_free_gpu_memory_     0.9     the memory free after weights and
           fraction`` (trtllm-serve)                 buffers (KV cache only)
========== ================================= ======= ====================================

Recognised by the command (``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``,
``python -m sglang.launch_server``, ``text-generation-launcher``, ``trtllm-serve``) or, when
the container gives no command, by the image whose ENTRYPOINT starts the engine
(``vllm/vllm-openai``, ``ghcr.io/huggingface/text-generation-inference``); an SGLang or
TensorRT-LLM image without a command, or an engine started from a shell string
(``sh -c "vllm serve ..."``), cannot be set: :attr:`EngineUse.settable` is false and the rule
warns with the flag to add. Pure (floor 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final


@dataclass(frozen=True, slots=True)
class ServingEngine:
    name: str
    flags: tuple[str, ...]  # the spellings the engine reads; the first is written
    env: str | None = None  # an environment variable it reads instead (TGI)
    launchers: tuple[str, ...] = ()  # executables that start it (basename)
    modules: tuple[str, ...] = ()  # ``python -m`` modules that start it
    subcommand: tuple[str, str] | None = None  # (executable, subcommand), ``vllm serve``
    images: tuple[str, ...] = ()  # image repositories
    image_entrypoint: bool = False  # the image's ENTRYPOINT starts it: ``args`` are its flags


VLLM: Final = ServingEngine(
    "vLLM", ("--gpu-memory-utilization", "--gpu_memory_utilization"),
    modules=("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"),
    subcommand=("vllm", "serve"), images=("vllm/vllm-openai", "docker.io/vllm/vllm-openai"),
    image_entrypoint=True)
SGLANG: Final = ServingEngine(
    "SGLang", ("--mem-fraction-static",), modules=("sglang.launch_server",),
    images=("lmsysorg/sglang", "docker.io/lmsysorg/sglang"))
TGI: Final = ServingEngine(
    "TGI", ("--cuda-memory-fraction",), env="CUDA_MEMORY_FRACTION",
    launchers=("text-generation-launcher",),
    images=("ghcr.io/huggingface/text-generation-inference",), image_entrypoint=True)
TRTLLM: Final = ServingEngine(
    "TensorRT-LLM", ("--kv_cache_free_gpu_memory_fraction", "--free_gpu_memory_fraction"),
    launchers=("trtllm-serve",), images=("nvcr.io/nvidia/tensorrt-llm/release",))
ENGINES: Final = (VLLM, SGLANG, TGI, TRTLLM)

_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh"})


@dataclass(frozen=True, slots=True)
class Setting:
    """One occurrence of the engine's flag: where (``args``/``command`` and index of the
    element holding the value) and the value as written."""

    flag: str  # the spelling used
    field: str
    index: int
    value: str | None  # None: the flag is the last element, no value follows
    joined: bool  # ``--flag=value`` in one element (else the value is the next element)


@dataclass(frozen=True, slots=True)
class EngineUse:
    engine: ServingEngine
    settable: bool  # an argument can be appended (exec form, or the image's entrypoint)
    settings: tuple[Setting, ...] = field(default=())  # the flag as the container gives it
    why: str = ""  # how it was recognised
    script: str = ""  # the shell string it runs from (not settable)


def _strings(value: Any) -> list[str] | None:
    if not isinstance(value, list):
        return None
    return [v if isinstance(v, str) else str(v) for v in value]


def _basename(token: str) -> str:
    return token.rsplit("/", 1)[-1]


def _repository(image: str) -> str:
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def _starts(engine: ServingEngine, argv: Sequence[str]) -> bool:
    for i, token in enumerate(argv):
        base = _basename(token)
        if base in engine.launchers:
            return True
        if engine.subcommand is not None and base == engine.subcommand[0] \
                and i + 1 < len(argv) and argv[i + 1] == engine.subcommand[1]:
            return True
        if token == "-m" and i + 1 < len(argv) and argv[i + 1] in engine.modules:
            return True
    return False


def _in_script(engine: ServingEngine, script: str) -> bool:
    words = script.replace(";", " ").replace("&", " ").replace("|", " ").split()
    return _starts(engine, words)


def _settings(engine: ServingEngine, fields: Mapping[str, list[str]]) -> tuple[Setting, ...]:
    found: list[Setting] = []
    for name, items in fields.items():
        for i, token in enumerate(items):
            for flag in engine.flags:
                if token == flag:
                    found.append(Setting(flag, name, i + 1, items[i + 1] if i + 1 < len(items)
                                         else None, False))
                elif token.startswith(flag + "="):
                    found.append(Setting(flag, name, i, token[len(flag) + 1:], True))
    return tuple(found)


def recognise(container: Mapping[str, Any]) -> EngineUse | None:
    """The serving engine ``container`` runs, if it is one of :data:`ENGINES`."""
    command = _strings(container.get("command"))
    args = _strings(container.get("args"))
    argv = (command or []) + (args or [])
    if argv and _basename(argv[0]) in _SHELLS and "-c" in argv:
        script = " ".join(argv[argv.index("-c") + 1:])
        for engine in ENGINES:
            if _in_script(engine, script):
                return EngineUse(engine, False, why="a shell command", script=script)
        return None
    fields = {k: v for k, v in (("command", command), ("args", args)) if v}
    for engine in ENGINES:
        if _starts(engine, argv):
            return EngineUse(engine, True, _settings(engine, fields), "its command")
    image = container.get("image")
    repository = _repository(image) if isinstance(image, str) else ""
    for engine in ENGINES:
        if repository in engine.images:
            settable = engine.image_entrypoint and command is None
            return EngineUse(engine, settable, _settings(engine, fields) if settable else (),
                             f"image {repository}")
    return None

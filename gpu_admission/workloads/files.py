"""Reading the Kubernetes manifests a user hands a command (``evaluate -f``, ``images scan
-f``): files or stdin, YAML or JSON, ``List`` kinds expanded. File I/O (floor 2,
docs/architecture.md), shared by the command-line faces.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import yaml

from gpu_admission.workloads.kinds import expand_lists


class InputError(click.ClickException):
    """Unusable input: exit code 2, one clear message, no traceback."""

    exit_code = 2


#: The file extensions ``kubectl apply -f DIR`` reads in a directory (k8s.io/cli-runtime
#: pkg/resource/visitor.go ``FileExtensions``).
MANIFEST_EXTENSIONS = (".json", ".yaml", ".yml")


def expand_paths(names: tuple[str, ...] | list[str], recursive: bool = False) -> list[str]:
    """Each ``-f`` argument as the files it names, as kubectl does: a file as itself (any
    extension), ``-`` as stdin, a directory as its ``.json``/``.yaml``/``.yml`` files in
    name order (and its subdirectories' with ``recursive``, ``-R``). A directory without any
    is an :class:`InputError`, like a missing path."""
    out: list[str] = []
    for name in names:
        path = Path(name)
        if name == "-" or not path.is_dir():
            out.append(name)
            continue
        pattern = "**/*" if recursive else "*"
        found = sorted(str(p) for p in path.glob(pattern)
                       if p.is_file() and p.suffix in MANIFEST_EXTENSIONS)
        if not found:
            raise InputError(f"{name}: no .json, .yaml or .yml files in the directory"
                             + ("" if recursive else " (-R reads its subdirectories)"))
        out.extend(found)
    return out


def read_documents(name: str) -> list[Any]:
    """The documents of one YAML/JSON file (``-``: stdin), ``kind: List`` items expanded;
    :class:`InputError` naming the file and what is wrong when it cannot be read or parsed."""
    if name == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(name).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(f"{name}: no such file") from None
        except IsADirectoryError:
            raise InputError(f"{name}: is a directory, expected a YAML or JSON file") from None
        except UnicodeDecodeError:
            raise InputError(f"{name}: not UTF-8 text") from None
        except OSError as exc:
            raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from None
    try:
        # YAML 1.1 safe loader; JSON documents parse as YAML flow style too.
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise InputError(f"{name}: invalid YAML/JSON: {where}"
                         f"{getattr(exc, 'problem', None) or exc}") from None
    out: list[Any] = []
    for doc in docs:
        out.extend(expand_lists(doc) if not isinstance(doc, list) else doc)
    return out

"""``gpu-admission simulate`` through its command line (a subprocess, as a user runs it):
the paper's baselines reproduced on Alibaba's openb trace, the JSON shape, and bad input
refused with the row and field named (exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path("/work/shared/data/openb")
NODES = DATA / "openb_node_list_gpu_node.csv"
DEFAULT = DATA / "openb_pod_list_default.csv"
PAPER = DATA / "published-fgd-atc23.tsv"

needs_trace = pytest.mark.skipif(not NODES.exists(), reason="openb trace not available")


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_admission", "simulate",
                           *map(str, args)], capture_output=True, text=True, timeout=300,
                          check=False)


def paper_row(trace: str, policy: str) -> float:
    for line in PAPER.read_text().splitlines()[1:]:
        cols = line.split("\t")
        if cols[0] == trace and cols[1].endswith(policy):
            return float(cols[3])
    raise AssertionError(f"no paper row {trace} {policy}")


@needs_trace
@pytest.mark.parametrize("placement, paper", [("random", "Random"), ("bestfit", "BestFit")],
                         ids=["random", "bestfit"])
def test_baseline_within_one_point_of_the_paper(placement: str, paper: str) -> None:
    # one seed, the curve up to 100 % of arrived demand (the figure the paper reports)
    out = run("--nodes", NODES, "--pods", DEFAULT, "--placement", placement, "--seed", "42",
              "--until", "100", "-o", "json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert abs(result["curve"]["100"] - paper_row("default", paper)) <= 1.0
    assert set(result["curve"]) == {str(p) for p in range(0, 101)}
    assert result["gpus"] == 6212
    assert out.stderr == ""  # no progress bar when stderr is not a terminal


NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"


@pytest.mark.parametrize("nodes, pods, message", [
    ("sn,cpu_milli,memory_mib,model\nn0,64000,262144,T4\n",
     POD_HEADER + "p0,1000,1024,1,500,\n",
     "row 1 (header): missing column gpu"),
    (NODE_HEADER + "n0,64000,262144,2,T4\nn1,64000,262144,0,T4\n",
     POD_HEADER + "p0,1000,1024,1,500,\n",
     "row 3, field gpu: node n1 of GPU model T4 (its fractional pool) has no GPUs"),
    (NODE_HEADER + "n0,64000,262144,2,T4\n",
     POD_HEADER + "p0,1000,1024,1,500,\np1,1000,1024,1,1500,\n",
     "row 3, field gpu_milli: pod p1 asks 1500 milli-GPU of one card"),
    (NODE_HEADER + "n0,64000,262144,2,T4\n",
     POD_HEADER + "p0,many,1024,1,500,\n",
     "row 2, field cpu_milli: expected an integer, got 'many'"),
], ids=["missing-column", "node-without-gpus", "share-over-one-card", "not-an-integer"])
def test_bad_input_names_row_and_field(tmp_path: Path, nodes: str, pods: str,
                                       message: str) -> None:
    (tmp_path / "nodes.csv").write_text(nodes)
    (tmp_path / "pods.csv").write_text(pods)
    out = run("--nodes", tmp_path / "nodes.csv", "--pods", tmp_path / "pods.csv")
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_small_trace_table_and_json(tmp_path: Path) -> None:
    # 2 nodes x 2 T4; a CPU pod that fits must be placed; a share pod pinned to a model
    # the cluster lacks fails and is reported by kind
    (tmp_path / "nodes.csv").write_text(NODE_HEADER + "n0,8000,32768,2,T4\n"
                                        "n1,8000,32768,2,T4\n")
    (tmp_path / "pods.csv").write_text(POD_HEADER + "a,2000,4096,1,500,\nb,2000,4096,0,0,\n"
                                       "c,2000,4096,1,500,V100M32\nd,4000,8192,2,1000,\n")
    out = run("--nodes", tmp_path / "nodes.csv", "--pods", tmp_path / "pods.csv",
              "--tune", "0", "-o", "json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["failed_pods"] == {"cpu": 0, "share": 1, "1-gpu": 0, "multi-gpu": 0}
    assert r["arrived_pods"] == {"cpu": 1, "multi-gpu": 1, "share": 2}
    assert r["unallocated_gpus"]["total_gpus"] == 1.5
    table = run("--nodes", tmp_path / "nodes.csv", "--pods", tmp_path / "pods.csv",
                "--tune", "0")
    assert "failed pods: cpu 0, share 1, 1-gpu 0, multi-gpu 0" in table.stdout

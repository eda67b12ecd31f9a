"""scripts/bench_gpu.sh's own plumbing, with a stand-in for Python: the device brings back at most 8
files, so everything a run writes must come back packed in one archive beside its log, and no step may
run past the deadline (the device run's own limit would kill the packing too)."""
from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKE_PYTHON = """#!/bin/bash
# Stands in for python: writes what --out names (a .json file, or a folder with results.json).
out=""
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
if [ -n "$out" ]; then
  case "$out" in *.json) mkdir -p "$(dirname "$out")"; echo '{}' > "$out";; *) mkdir -p "$out"; echo '{}' > "$out/results.json";; esac
fi
exit 0
"""


def run_script(tmp_path: Path, **env) -> tuple[Path, str]:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    out = tmp_path / "out"
    full = {**os.environ, "PYTHON": str(fake), "OUT": str(out), **env}
    done = subprocess.run(["bash", "scripts/bench_gpu.sh"], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return out, done.stdout


def test_bench_gpu_packs_every_result_into_one_archive_beside_its_log(tmp_path):
    out, _ = run_script(tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["gpu_results.tgz", "log.txt"]
    with tarfile.open(out / "gpu_results.tgz") as tar:
        names = set(tar.getnames())
    for want in ("qwen2-0.5b-oracle/results.json", "exactness.json", "batch.json", "qwen2-0.5b-eager/results.json",
                 "qwen2-0.5b-compiled/results.json", "embedded/results.json", "log.txt", "env.txt"):
        assert f"./{want}" in names, want
    assert "total:" in (out / "log.txt").read_text()


def test_bench_gpu_skips_what_the_deadline_leaves_no_time_for(tmp_path):
    out, log = run_script(tmp_path, DEADLINE="10")
    assert log.count("skipped") == 6 and "deadline 10s" in log
    assert (out / "gpu_results.tgz").is_file()

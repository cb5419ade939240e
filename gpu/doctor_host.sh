#!/usr/bin/env bash
# vllm-patch doctor on a GPU host without PyPI, against vLLM 0.33.0 "installed" from its sdist's files (a venv on the
# host's torch and Triton, a dist-info with a real RECORD) with the current line applied by the tool: the install,
# the route table, the kernel check and its timing, with no cap and under the 99 KiB and 64 KiB caps.
# Here, in the repository root (ignored by git: add /.gpu-doctor/ to .git/info/exclude):
#   mkdir -p .gpu-doctor/whl && cp gpu/doctor_host.sh .gpu-doctor/run.sh
#   tar -C <0.33.0 sdist tree> -cJf .gpu-doctor/v033.tar.xz --exclude=__pycache__ vllm
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .gpu-doctor/whl \
#       unidiff GitPython gitdb smmap platformdirs installer pyflakes
# On the GPU host, from the repository root with .gpu-doctor/ beside it (the reports go to DIR):
#   rm -rf /tmp/venv /tmp/site /tmp/v033; bash .gpu-doctor/run.sh DIR
set -euo pipefail
REPORTS=${1:?usage: run.sh DIR (where the reports go)}
mkdir -p "$REPORTS"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-doctor/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/tool
mkdir -p /tmp/v033 && tar -C /tmp/v033 -xJf .gpu-doctor/v033.tar.xz
python3 -m venv --system-site-packages /tmp/venv
SITE=$(/tmp/venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# torch and Triton where the host's python3 finds them, after the venv's own packages
python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" > "$SITE/zz_host.pth"
python3 - "$SITE" <<'PY'
import sys
sys.path.insert(0, "tests/support")
from pathlib import Path
from helpers import make_site_packages
root = Path("/tmp/v033")
files = {str(p.relative_to(root)): p.read_bytes() for p in (root / "vllm").rglob("*") if p.is_file()}
make_site_packages(Path(sys.argv[1]), files, version="0.33.0")
PY
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $REPORTS/gpu.txt
python3 -m vllm_patch status --python /tmp/venv/bin/python | tail -2 || true
python3 -m vllm_patch apply --python /tmp/venv/bin/python | tail -2
for cap in none none-warm 101376 65536; do
  echo "== cap=$cap"
  start=$(date +%s%N)
  if [[ $cap =~ ^[0-9]+$ ]]; then export VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY=$cap; fi
  python3 -m vllm_patch doctor --python /tmp/venv/bin/python > $REPORTS/doctor-$cap.txt 2>&1 && rc=0 || rc=$?
  echo "rc=$rc wall=$(( ($(date +%s%N) - start) / 1000000 )) ms" | tee -a $REPORTS/doctor-$cap.txt
  tail -30 $REPORTS/doctor-$cap.txt
done
unset VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY
python3 -m vllm_patch doctor --python /tmp/venv/bin/python --json > $REPORTS/doctor.json 2>$REPORTS/doctor-json.err && echo json-rc=0 || echo json-rc=$?

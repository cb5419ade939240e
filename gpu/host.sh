#!/usr/bin/env bash
# The GPU host's side of the harness: assemble the offline bundle that gpu/bundle.py
# made, then run the kernel tests and the scenarios on the pristine and the patched vLLM.
# Release line v0.20 (lines/v0.20, vLLM 0.20.0), whose stack the host has; the current line
# (vLLM 0.33) runs from a stack bundle (gpu/stack.sh).
# Needs python3 with CUDA torch 2.11, triton 3.6, transformers and pytest; no network.
#
#   gpu/host.sh stage DIR...      copy bundle parts (the .gpu/pN folders) into $VP_HOME/parts
#   gpu/host.sh setup             unpack vLLM, install the wheels, make the patched tree
#   gpu/host.sh kernels [ARGS]    kernel tests on both trees (pytest ARGS)
#   gpu/host.sh scenarios [ARGS]  scenarios on both trees (harness run ARGS, e.g. --scenarios a)
#   gpu/host.sh bench             the GPU benchmarks (benchmarks/bench_*.py), printed and saved with the report
#   gpu/host.sh bench-e2e GROUP [ARGS]   one group of benchmarks/bench_spec_e2e.py (e.g. verify --context 32768,
#                                       hybrid --only ngram), saved as bench-spec-e2e-GROUP[-CONTEXT|-ONLY].txt
#   gpu/host.sh all               setup, kernels, scenarios
#   gpu/host.sh bad-tree          $VP_HOME/sabotaged: the patched tree with an off-by-one in the
#                                       verify rows' causal lengths (each row misses its own token), a
#                                       known bad tree the oracle must catch (VP_TREES="patched sabotaged")
#   gpu/host.sh save-cache FILE | load-cache FILE   Triton and vLLM compile caches, as tar.xz
#   gpu/host.sh kernel-pack DIR CMD...   kernel-level runs without the vLLM wheel: unpack the pack
#                                       gpu/kernel_pack.py made in DIR, run CMD with both trees named, e.g.
#                                       kernel-pack .gpu/kt python3 -m pytest -n 14 tests/lines/v0_20/kernels tests/lines/v0_20/turboquant
#
# VP_HOME (default /tmp/vllm-patch-gpu) holds everything; VP_REPORT (default tests/gpu/reports)
# receives the report; VP_TREES (default "unpatched patched") picks the trees.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LINE=v0.20
VP_HOME=${VP_HOME:-/tmp/vllm-patch-gpu}
VP_REPORT=${VP_REPORT:-$ROOT/tests/gpu/reports}
VP_TREES=${VP_TREES:-unpatched patched}
PY=${PYTHON:-python3}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$VP_HOME/work/cache/triton}
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-$VP_HOME/work/cache/vllm}

die() { echo "host.sh: $*" >&2; exit 2; }
# shellcheck source=gpu/lib.sh
. "$ROOT/gpu/lib.sh"

stage() {
    mkdir -p "$VP_HOME/parts"
    for dir in "$@"; do
        [ -d "$dir" ] || die "no bundle part folder $dir"
        cp -r "$dir"/. "$VP_HOME/parts/"
    done
    ls "$VP_HOME/parts"
}

setup() {
    local parts=$VP_HOME/parts manifest=$VP_HOME/parts/manifest.json
    [ -f "$manifest" ] || die "no manifest in $parts: stage the bundle parts first"
    if [ ! -f "$VP_HOME/pristine/.complete" ]; then
        "$PY" - "$parts" "$VP_HOME/pristine" <<'EOF'
import hashlib, json, sys, tarfile
from pathlib import Path
parts, dest = Path(sys.argv[1]), Path(sys.argv[2])
manifest = json.loads((parts / "manifest.json").read_text())
names = [Path(p).name for p in manifest["parts"]]
missing = [n for n in names if not (parts / n).exists()]
if missing:
    sys.exit(f"host.sh: bundle parts missing: {', '.join(missing)}")
archive = parts / manifest["archive"]
with open(archive, "wb") as out:
    for n in names:
        out.write((parts / n).read_bytes())
digest = hashlib.sha256(archive.read_bytes()).hexdigest()
if digest != manifest["archive_sha256"]:
    sys.exit(f"host.sh: {archive} sha256 {digest} != {manifest['archive_sha256']}")
with tarfile.open(archive, "r:xz") as tar:
    tar.extractall(dest, filter="data")
(dest / ".complete").write_text(manifest["note"] + "\n")
print("unpacked", manifest["note"])
EOF
    fi
    if [ ! -f "$VP_HOME/site/.complete" ]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$VP_HOME/site" \
            "$parts"/wheels/*.whl
        touch "$VP_HOME/site/.complete"
    fi
    # The patched tree is made anew whenever the line's series changed.
    local digest
    digest=$(series_digest "$ROOT/lines/$LINE")
    if [ "$(cat "$VP_HOME/patched/.series" 2>/dev/null)" != "$digest" ]; then
        rm -rf "$VP_HOME/patched"
        cp -a "$VP_HOME/pristine" "$VP_HOME/patched"
        tool apply --target "$VP_HOME/patched"
        echo "$digest" >"$VP_HOME/patched/.series"
    fi
    tool status --target "$VP_HOME/patched" --expect applied
}

tool() { (cd "$ROOT" && PYTHONPATH="$ROOT/tool:$VP_HOME/site" "$PY" -m vllm_patch --line "$LINE" "$@"); }

# The kernel tests load vLLM files from both trees; the GDN builder tests import the patched vLLM itself.
kernels() {
    cd "$ROOT"
    VLLM_PATCH_PRISTINE_TREE=$VP_HOME/pristine VLLM_PATCH_PATCHED_TREE=$VP_HOME/patched \
        PYTHONPATH="$ROOT/tool:$VP_HOME/patched:$VP_HOME/site" "$PY" -m pytest -q -p no:cacheprovider \
        tests/lines/v0_20/kernels tests/lines/v0_20/turboquant tests/lines/v0_20/gdn "$@"
}

scenarios() {
    local trees=()
    for t in $VP_TREES; do
        case $t in
            unpatched) trees+=(--tree "unpatched=$VP_HOME/pristine") ;;
            patched) trees+=(--tree "patched=$VP_HOME/patched") ;;
            sabotaged) trees+=(--tree "sabotaged=$VP_HOME/sabotaged") ;;
            *) die "unknown tree $t (unpatched, patched, sabotaged)" ;;
        esac
    done
    cd "$ROOT/gpu"
    PYTHONPATH="$ROOT/gpu" "$PY" -m harness run "${trees[@]}" --path "$VP_HOME/site" \
        --work "$VP_HOME/work" --out "$VP_REPORT" --bundle-note "$(cat "$VP_HOME/pristine/.complete")" "$@"
}

# Each benchmark's output goes to the terminal and to $VP_REPORT/bench-NAME.txt.
bench() {
    cd "$ROOT"
    mkdir -p "$VP_REPORT"
    local kernel_env=(env VLLM_PATCH_PRISTINE_TREE="$VP_HOME/pristine" VLLM_PATCH_PATCHED_TREE="$VP_HOME/patched")
    "${kernel_env[@]}" "$PY" benchmarks/bench_tq_verify.py | tee "$VP_REPORT/bench-tq-verify.txt"
    "${kernel_env[@]}" "$PY" benchmarks/bench_gdn_recovery.py | tee "$VP_REPORT/bench-gdn-recovery.txt"
    "${kernel_env[@]}" "$PY" benchmarks/bench_tq_mq_verify.py --presets k8v4,4bit_nc | tee "$VP_REPORT/bench-tq-mq-verify.txt"
    bench_e2e llama
    bench_e2e hybrid --only ngram
    bench_e2e hybrid --only mtp
    bench_e2e verify --context 8192
    bench_e2e verify --context 32768
}

# One group of benchmarks/bench_spec_e2e.py (ARGS passed on), saved as bench-spec-e2e-GROUP[-CONTEXT|-ONLY].txt.
bench_e2e() {
    local group=$1 tag=$1
    shift
    [ "${1:-}" = --context ] && tag="$group-$2"
    [ "${1:-}" = --only ] && tag="$group-$2"
    cd "$ROOT"
    mkdir -p "$VP_REPORT"
    "$PY" benchmarks/bench_spec_e2e.py --group "$group" --tree "unpatched=$VP_HOME/pristine" \
        --tree "patched=$VP_HOME/patched" --path "$VP_HOME/site" --work "$VP_HOME/work" "$@" \
        | tee "$VP_REPORT/bench-spec-e2e-$tag.txt"
}

bad_tree() {
    local file=vllm/v1/attention/ops/triton_turboquant_decode.py
    rm -rf "$VP_HOME/sabotaged"
    cp -a "$VP_HOME/patched" "$VP_HOME/sabotaged"
    sed -i 's/torch.arange(1 - k1, 1,/torch.arange(-k1, 0,/' "$VP_HOME/sabotaged/$file"
    grep -q 'torch.arange(-k1, 0,' "$VP_HOME/sabotaged/$file" || die "the verify row lengths were not found in $file"
}

# Python's tarfile: the host may have no xz binary.
save_cache() {
    "$PY" -c 'import sys, tarfile; t = tarfile.open(sys.argv[1], "w:xz", preset=1); t.add(sys.argv[2], "cache"); t.close()' \
        "$1" "$VP_HOME/work/cache"
    ls -la "$1"
}
load_cache() {
    mkdir -p "$VP_HOME/work"
    "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' "$1" "$VP_HOME/work"
}

# The trees as $VLLM_PATCH_PRISTINE_TREE / $VLLM_PATCH_PATCHED_TREE (unpacked anew: the pack may be newer),
# the wheels once per host.
kernel_pack() {
    local pack=$1 home=$VP_HOME/kernel-pack
    shift
    [ -f "$pack/trees.tar.xz" ] || die "no trees.tar.xz in $pack: run gpu/kernel_pack.py here first"
    rm -rf "$home/pristine" "$home/patched"
    mkdir -p "$home"
    "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
        "$pack/trees.tar.xz" "$home"
    if [ ! -f "$home/site/.complete" ]; then
        "$PY" -m pip install -q --no-index --no-deps --target "$home/site" "$pack"/wheels/*.whl
        touch "$home/site/.complete"
    fi
    cd "$ROOT"
    VLLM_PATCH_PRISTINE_TREE=$home/pristine VLLM_PATCH_PATCHED_TREE=$home/patched GIT_PYTHON_REFRESH=quiet \
        PYTHONPATH="$ROOT/tool:$home/site" "$@"
}

cmd=${1:-}
[ -n "$cmd" ] || die "usage: host.sh stage|setup|kernels|kernel-pack|scenarios|bench|bench-e2e|all|bad-tree|save-cache|load-cache ..."
shift
case $cmd in
    stage) stage "$@" ;;
    setup) setup ;;
    kernels) kernels "$@" ;;
    kernel-pack) kernel_pack "$@" ;;
    scenarios) scenarios "$@" ;;
    bench) bench ;;
    bench-e2e) bench_e2e "$@" ;;
    all) setup && kernels && scenarios "$@" ;;
    bad-tree) bad_tree ;;
    save-cache) save_cache "$@" ;;
    load-cache) load_cache "$@" ;;
    *) die "unknown command $cmd" ;;
esac

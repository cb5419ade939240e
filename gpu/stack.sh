#!/usr/bin/env bash
# The GPU host's side of a stack bundle (gpu/stack_bundle.py): a release line's own torch, triton, NCCL,
# vLLM and Python packages in a private prefix, for a line whose vLLM needs another torch than the host's; or, for a
# line on the host's own torch (v0.25: the manifest's "host_torch"), its vLLM and the Python packages the host lacks,
# in front of the host's torch, triton and CUDA libraries.
# The host's torch, its site-packages and the $VP_HOME trees of gpu/host.sh are never written to.
# Needs python3.12 (the bundle's Python; PYTHON picks another executable) and no network.
#
# LINE is `current` (the top-level series, vLLM 0.33 now), a folder of lines/ (e.g. v0.20), or vX.Y naming the
# line pinned to vLLM X.Y wherever it lives (v0.33: the top-level series while it is the current line). A stack is
# named after its line's release, vX.Y: `current` and `v0.33` are the same stack, in $VP_HOME/stack/v0.33.
#
#   gpu/stack.sh stage DIR...      copy part folders (.gpu/v0.33/pNN) into $VP_HOME/stack/vX.Y/parts
#   gpu/stack.sh check LINE        which parts are still missing or corrupt (one line), else a summary
#   gpu/stack.sh setup LINE        check every sha256, unpack into $VP_HOME/stack/LINE/prefix/site
#   gpu/stack.sh run LINE CMD...   CMD with the prefix first on PYTHONPATH and its nvidia libraries first
#                                        on LD_LIBRARY_PATH (then the host's); prints torch/triton/CUDA first
#   gpu/stack.sh scenarios LINE ARGS...  the harness on the line's vLLM, unpatched and patched
#                                        (VP_RUNNER=v1 or v2: engines under test on Model Runner V1 or V2,
#                                        labels *-v1/*-v2; unset: the release's default, V2 from 0.33;
#                                        VP_WITHOUT=NNNN: also the line without patch NNNN, tree without-NNNN)
#   gpu/stack.sh tests LINE ARGS...      pytest (tests/lines/vX_Y) on both trees with the line's torch
#                                        (VP_TESTS_TREE=unpatched: the tests against the release alone)
#   gpu/stack.sh bench LINE ARGS...      benchmarks/bench_spec_e2e.py on both trees (ARGS: --group ...;
#                                        VP_WITHOUT=NNNN: also the line without patch NNNN, tree `without`)
#   gpu/stack.sh users LINE ARGS...      benchmarks/bench_users_geometry.py on both trees (ARGS: --preset ...)
#                                        (bench and users: VP_WORK=DIR its own work folder, for runs at once)
#   gpu/stack.sh env LINE          the environment run uses, as export lines (for `eval`)
#   gpu/stack.sh clean-parts LINE  delete the staged parts (after setup; the prefix stays)
#
# VP_HOME (default /tmp/vllm-patch-gpu) holds everything.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VP_HOME=${VP_HOME:-/tmp/vllm-patch-gpu}
PY=${PYTHON:-python3.12}
command -v "$PY" >/dev/null 2>&1 || PY=python3
PARTS_PY=$ROOT/gpu/stack_parts.py

die() { echo "stack.sh: $*" >&2; exit 2; }
# shellcheck source=gpu/lib.sh
. "$ROOT/gpu/lib.sh"

pin_version() { [ -f "$1/series" ] || die "no series in $1"; sed -n 's/^#: version = //p' "$1/series"; }

# vX.Y of the release the series in directory $1 is pinned to (0.33.0: v0.33).
release_of() {
    local version
    version=$(pin_version "$1") || exit 2
    [ -n "$version" ] || die "no pinned version in $1/series"
    echo "v${version%.*}"
}

# The series directory of line $1.
series_dir() {
    local name=${1:-}
    [ -n "$name" ] || die "name the release line, e.g. current, v0.33 or v0.20"
    case $name in */* | .*) die "bad line name $name" ;; esac
    if [ "$name" = current ]; then
        echo "$ROOT"
    elif [ -f "$ROOT/lines/$name/series" ]; then
        echo "$ROOT/lines/$name"
    elif [ "$(release_of "$ROOT")" = "$name" ]; then
        echo "$ROOT"
    else
        die "no release line $name: no $ROOT/lines/$name, and the top-level series is pinned to vLLM $(pin_version "$ROOT")"
    fi
}

# The name vllm-patch's --line knows line $1 by.
tool_line() {
    local dir
    dir=$(series_dir "$1") || exit 2
    if [ "$dir" = "$ROOT" ]; then echo current; else echo "$1"; fi
}

# The stack name of line $1: vX.Y of its release.
stack_name() {
    local dir
    dir=$(series_dir "$1") || exit 2
    release_of "$dir"
}

stack_dir() {
    case ${1:-} in '' | */* | .*) die "bad stack name '${1:-}'" ;; esac
    echo "$VP_HOME/stack/$1"
}

line_dir() {
    local name
    name=$(stack_name "${1:-}") || exit 2
    stack_dir "$name"
}

stage() {
    [ $# -gt 0 ] || die "usage: stack.sh stage DIR..."
    local dir line dest
    for dir in "$@"; do
        [ -f "$dir/manifest.json" ] || die "no stack bundle part folder $dir (no manifest.json)"
        line=$("$PY" "$PARTS_PY" line "$dir")
        dest=$(stack_dir "$line")/parts
        mkdir -p "$dest"
        cp "$dir"/* "$dest/"
        echo "staged $dir for $line"
    done
}

# The host's own nvidia library folders (on its sys.path: site-packages, the caller's PYTHONPATH; not the
# prefix's), for LD_LIBRARY_PATH.
host_nvidia_libs() {
    "$PY" -c '
import glob, os, sys
print(":".join(d for r in dict.fromkeys(sys.path) if r for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib")))))'
}

stack_env() {
    local dir site libs host
    dir=$(line_dir "$1") || exit 2
    site=$dir/prefix/site
    [ -f "$dir/prefix/.complete" ] || die "no prefix for $1 in $dir: run stack.sh setup $1 first"
    libs=""
    # A stack on the host's torch carries no nvidia libraries.
    if [ -d "$site/nvidia" ]; then
        libs=$(find "$site/nvidia" -mindepth 2 -maxdepth 2 -type d -name lib | sort | paste -sd: -)
    fi
    host=$(host_nvidia_libs)
    echo "export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}"
    libs=$(printf '%s\n' "$libs" "$host" "${LD_LIBRARY_PATH:-}" | { grep -v '^$' || true; } | paste -sd: -)
    echo "export LD_LIBRARY_PATH=$libs"
    # Separate caches: kernels and graphs compiled by triton 3.6/torch 2.11 are no use here, nor the reverse.
    echo "export TRITON_CACHE_DIR=${STACK_TRITON_CACHE_DIR:-$dir/cache/triton}"
    echo "export VLLM_CACHE_ROOT=${STACK_VLLM_CACHE_ROOT:-$dir/cache/vllm}"
    echo "export TORCHINDUCTOR_CACHE_DIR=${STACK_INDUCTOR_CACHE_DIR:-$dir/cache/inductor}"
    # cuDNN stays the host's (9.19) unless it travelled: the line's torch (2.14 built with 9.24, 2.13 with 9.20) would
    # refuse it at first use. An LLM with FlashAttention 2 uses no cuDNN; see stack_bundle.py. The host's own torch
    # (a stack with "host_torch") was built for the host's cuDNN and needs no such leave.
    if ! grep -q '"cudnn_travels": true' "$dir/prefix/manifest.json" \
        && ! grep -q '"host_torch": true' "$dir/prefix/manifest.json"; then
        echo "export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1"
    fi
    # The release's sampler imports FlashInfer, which the stack does not carry, unless told not to.
    echo "export VLLM_USE_FLASHINFER_SAMPLER=0"
}

run() {
    local line=${1:-}
    shift || true
    [ $# -gt 0 ] || die "usage: stack.sh run LINE CMD..."
    local envs
    envs=$(stack_env "$line") || exit 2
    eval "$envs"
    "$PY" -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.is_available())' \
        || die "torch or triton of $line does not import (see above)"
    exec "$@"
}

# The line's trees: copies of the prefix's vllm/, the patched one with the line's series applied by vllm-patch
# (whose own wheels make gpu-stack-bundle leaves in .gpu/tool-wheels). Made once per series, so runs that use
# them at the same time (scenarios, tests, bench) never remake them under each other.
tool_deps() {
    local deps=$VP_HOME/tool-deps
    if [ ! -f "$deps/.complete" ]; then
        ls "$ROOT"/.gpu/tool-wheels/*.whl >/dev/null 2>&1 || die "no .gpu/tool-wheels (make gpu-stack-bundle)"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$deps" "$ROOT"/.gpu/tool-wheels/*.whl
        touch "$deps/.complete"
    fi
    echo "$deps"
}

make_trees() {
    local line=$1 dir
    dir=$(line_dir "$line") || exit 2
    [ -f "$dir/prefix/.complete" ] || die "no prefix for $line in $dir: run stack.sh setup $line first"
    # One maker at a time: a second run started meanwhile waits, then finds the trees made.
    (flock 9 && make_trees_locked "$line" "$dir") 9>"$dir/.trees.lock"
}

make_trees_locked() {
    local line=$1 dir=$2 site=$2/prefix/site trees=$2/trees deps digest t series tool_name
    deps=$(tool_deps)
    series=$(series_dir "$line") || exit 2
    tool_name=$(tool_line "$line") || exit 2
    digest=$(series_digest "$series")
    [ "$(cat "$trees/.series" 2>/dev/null)" = "$digest" ] && return 0
    rm -rf "$trees" && mkdir -p "$trees"
    for t in unpatched patched; do
        mkdir -p "$trees/$t"
        cp -a "$site/vllm" "$site"/vllm-*.dist-info "$trees/$t/"
    done
    (cd "$ROOT" && PYTHONPATH="$ROOT/tool:$deps" "$PY" -m vllm_patch --line "$tool_name" apply --target "$trees/patched") >&2
    echo "$digest" >"$trees/.series"
}

# The harness on both trees with the prefix's torch. ARGS go to `python -m harness run` (e.g. --scenarios f-).
scenarios() {
    local line=${1:-} dir trees version series suffix="" runner="" without=()
    shift || true
    case "${VP_RUNNER:-}" in
        v1) runner=0; suffix=-v1 ;;
        v2) runner=1; suffix=-v2 ;;
        "") ;;
        *) die "VP_RUNNER is v1 or v2 (unset: the release's default runner), not ${VP_RUNNER}" ;;
    esac
    dir=$(line_dir "$line") || exit 2
    [ -z "${VP_WITHOUT:-}" ] || patch_numbered "$line" "$VP_WITHOUT" >/dev/null || exit 2
    make_trees "$line"
    [ -z "${VP_WITHOUT:-}" ] || without=(--tree "without-$VP_WITHOUT$suffix=$(tree_without "$line" "$VP_WITHOUT")")
    trees=$dir/trees
    series=$(series_dir "$line") || exit 2
    version=$(pin_version "$series") || exit 2
    eval "$(stack_env "$line")"
    [ -z "$runner" ] || export VLLM_USE_V2_MODEL_RUNNER=$runner
    cd "$ROOT/gpu"
    "$PY" -m harness run --tree "unpatched$suffix=$trees/unpatched" --tree "patched$suffix=$trees/patched" \
        "${without[@]}" --work "$dir/work" --out "${VP_REPORT:-$ROOT/tests/gpu/reports}" --title "vLLM $version" "$@"
}

# The line's tests (tests/lines/v0_33 for the line pinned to 0.33) with its torch and triton, on the GPU: the
# release's files from the unpatched tree, the line's from the patched one (VP_TESTS_TREE=unpatched: from the
# release too, to show which tests the line makes pass).
line_tests() {
    local line=${1:-} dir key folder deps name
    shift || true
    dir=$(line_dir "$line") || exit 2
    make_trees "$line"
    deps=$(tool_deps)
    name=$(stack_name "$line") || exit 2
    key=V$(echo "${name#v}" | tr -d .)
    folder=$ROOT/tests/lines/$(echo "$name" | tr . _)
    [ -d "$folder" ] || die "no tests for $line in $folder"
    eval "$(stack_env "$line")"
    cd "$ROOT"
    env "VLLM_PATCH_${key}_PRISTINE_TREE=$dir/trees/unpatched" "VLLM_PATCH_${key}_TREE=$dir/trees/${VP_TESTS_TREE:-patched}" \
        GIT_PYTHON_REFRESH=quiet PYTHONPATH="$ROOT/tool:$PYTHONPATH:$deps" \
        "$PY" -m pytest -q -p no:cacheprovider "$folder" "$@"
}

# The file name of the line's patch numbered $2 (e.g. 0005).
patch_numbered() {
    local series
    [[ $2 =~ ^[0-9]{4}$ ]] || die "VP_WITHOUT is a patch number such as 0005, not $2"
    series=$(series_dir "$1") || exit 2
    grep -oE "^$2-[^ ]*\.patch" "$series/series" || die "VP_WITHOUT: no patch $2 in the series of $1"
}

# The line's series without patch $2 (its number, e.g. 0005) on a copy of the release, beside the line's trees
# (made again when the series changes): the baseline of an A/B comparison of that patch.
tree_without() {
    local line=$1 num=$2 dir name tree tmp deps
    dir=$(line_dir "$line") || exit 2
    name=$(patch_numbered "$line" "$num") || exit 2
    tree=$dir/trees/without-$num
    if [ ! -f "$tree/.complete" ]; then
        deps=$(tool_deps)
        tmp=$(mktemp -d)
        mkdir -p "$tree"
        # The line as a plain series (patches it carries from another line copied in), less the one patch.
        (cd "$ROOT" && PYTHONPATH="$ROOT/tool:$deps" "$PY" -m vllm_patch --line "$(tool_line "$line")" export "$tmp/x") >&2
        mv "$tmp/x/patches" "$tmp/patches"
        grep -v -x -F "$name" "$tmp/x/series" >"$tmp/series"
        cp -a "$dir/prefix/site/vllm" "$dir/prefix/site"/vllm-*.dist-info "$tree/"
        (cd "$ROOT" && PYTHONPATH="$ROOT/tool:$deps" "$PY" -m vllm_patch --series "$tmp" apply --target "$tree") >&2
        rm -rf "$tmp"
        touch "$tree/.complete"
    fi
    echo "$tree"
}

# benchmarks/SCRIPT.py (bench_spec_e2e or bench_users_geometry) on both trees (VP_WITHOUT=NNNN: and on the
# line without patch NNNN, tree `without`); its output also goes to $VP_REPORT/SCRIPT-LINE-ARGS.txt (with
# dashes: bench-spec-e2e-...).
bench() {
    local script=$1 line=${2:-} dir tag name report=${VP_REPORT:-$ROOT/tests/gpu/reports} without=()
    shift 2 || shift $#
    dir=$(line_dir "$line") || exit 2
    [ -z "${VP_WITHOUT:-}" ] || patch_numbered "$line" "$VP_WITHOUT" >/dev/null || exit 2
    make_trees "$line"
    [ -z "${VP_WITHOUT:-}" ] || without=(--tree "without=$(tree_without "$line" "$VP_WITHOUT")")
    name=$(stack_name "$line") || exit 2
    tag=$(echo "$name $*" | tr -c 'A-Za-z0-9.\n' - | tr -s - | sed 's/-$//')
    eval "$(stack_env "$line")"
    mkdir -p "$report"
    cd "$ROOT"
    "$PY" "benchmarks/$script.py" --tree "unpatched=$dir/trees/unpatched" --tree "patched=$dir/trees/patched" \
        "${without[@]}" --work "${VP_WORK:-$dir/work}" "$@" | tee "$report/${script//_/-}-$tag.txt"
}

cmd=${1:-}
[ -n "$cmd" ] || die "usage: stack.sh stage|check|setup|run|scenarios|tests|bench|users|env|clean-parts ..."
shift
case $cmd in
    stage) stage "$@" ;;
    check) dir=$(line_dir "${1:-}"); "$PY" "$PARTS_PY" check "$dir/parts" ;;
    setup) dir=$(line_dir "${1:-}"); "$PY" "$PARTS_PY" setup "$dir/parts" "$dir/prefix" ;;
    run) run "$@" ;;
    scenarios) scenarios "$@" ;;
    tests) line_tests "$@" ;;
    bench) bench bench_spec_e2e "$@" ;;
    users) bench bench_users_geometry "$@" ;;
    env) stack_env "${1:-}" ;;
    clean-parts) dir=$(line_dir "${1:-}"); rm -rf "$dir/parts" ;;
    *) die "unknown command $cmd" ;;
esac

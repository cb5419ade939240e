#!/usr/bin/env bash
# Long GPU runs outside the command that starts them: a lent GPU host ends a command after 10 minutes and gives
# the machine back when no command comes for a while, so a run of scenarios or benchmarks is started detached
# (its own process session) and followed by short commands that wait and report, keeping the host busy.
#
#   gpu/jobs.sh start NAME CMD...   run CMD detached; its output goes to $VP_HOME/jobs/NAME.log
#   gpu/jobs.sh wait SECONDS        wait until every job ended or SECONDS passed; print each job's state
#                                         and the last lines of its log
#   gpu/jobs.sh collect DEST        copy every job's log and the reports in $VP_REPORT (if set) into DEST
#
# A job's exit status is kept in $VP_HOME/jobs/NAME.rc once it ends. VP_HOME defaults to /tmp/vllm-patch-gpu.
set -euo pipefail

VP_HOME=${VP_HOME:-/tmp/vllm-patch-gpu}
JOBS=$VP_HOME/jobs

die() { echo "jobs.sh: $*" >&2; exit 2; }

start() {
    local name=${1:-}
    shift || true
    [ -n "$name" ] && [ $# -gt 0 ] || die "usage: jobs.sh start NAME CMD..."
    case $name in */* | .* | *' '*) die "bad job name $name" ;; esac
    mkdir -p "$JOBS"
    [ -f "$JOBS/$name.pid" ] && [ ! -f "$JOBS/$name.rc" ] && die "job $name is still running"
    rm -f "$JOBS/$name.rc"
    # setsid: the job outlives the command that started it; its status is written when it ends.
    setsid bash -c '"$@" >"$0.log" 2>&1; echo $? >"$0.rc"' "$JOBS/$name" "$@" </dev/null >/dev/null 2>&1 &
    echo $! >"$JOBS/$name.pid"
    echo "started $name (log $JOBS/$name.log)"
}

running() {
    local pid
    for pid in "$JOBS"/*.pid; do
        [ -e "$pid" ] || continue
        [ -f "${pid%.pid}.rc" ] || return 0
    done
    return 1
}

wait_jobs() {
    local seconds=${1:-}
    [[ $seconds =~ ^[0-9]+$ ]] || die "usage: jobs.sh wait SECONDS"
    local end=$((SECONDS + seconds)) pid name
    while running && [ $SECONDS -lt $end ]; do sleep 5; done
    for pid in "$JOBS"/*.pid; do
        [ -e "$pid" ] || continue
        name=$(basename "${pid%.pid}")
        if [ -f "$JOBS/$name.rc" ]; then
            echo "== $name: ended, exit $(cat "$JOBS/$name.rc")"
        else
            echo "== $name: running"
        fi
        tail -n 5 "$JOBS/$name.log" 2>/dev/null | cut -c1-300 || true
    done
}

collect() {
    local dest=${1:-}
    [ -n "$dest" ] || die "usage: jobs.sh collect DEST"
    mkdir -p "$dest"
    cp "$JOBS"/*.log "$dest"/ 2>/dev/null || true
    if [ -n "${VP_REPORT:-}" ] && [ -d "$VP_REPORT" ]; then
        cp "$VP_REPORT"/* "$dest"/ 2>/dev/null || true
    fi
    ls "$dest"
}

cmd=${1:-}
[ -n "$cmd" ] || die "usage: jobs.sh start|wait|collect ..."
shift
case $cmd in
    start) start "$@" ;;
    wait) wait_jobs "$@" ;;
    collect) collect "$@" ;;
    *) die "unknown command $cmd" ;;
esac

# Sourced by host.sh and stack.sh.

# A digest of the series in directory $1 (its series file, and the patches of every line, which it may carry
# patches from): the trees made from a series are made anew when it changes.
series_digest() {
    [ -f "$1/series" ] || { echo "no series in $1" >&2; return 2; }
    local project=$1
    [ "$(basename "$(dirname "$1")")" = lines ] && project=$(dirname "$(dirname "$1")")
    cat "$1/series" "$project"/patches/*.patch "$project"/lines/*/patches/*.patch 2>/dev/null | sha256sum | cut -c1-16
}

# Sourced by host.sh and stack.sh.

# A digest of the series in directory $1 (its series file and patches): the trees made from a series are
# made anew when it changes.
series_digest() {
    [ -f "$1/series" ] || { echo "no series in $1" >&2; return 2; }
    cat "$1/series" "$1"/patches/*.patch | sha256sum | cut -c1-16
}

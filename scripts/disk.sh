# Sourced by setup.sh and torch.sh: refuse a pip install that cannot fit,
# with one line that says how much is free and what to do, instead of pip's
# "No space left on device" half-way through a 5 GB venv.
# need_disk DIR GIB WHAT
need_disk() {
    local dir="$1" want_gib="$2" what="$3" free_kib
    free_kib="$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { print $4 }')"
    [ -n "$free_kib" ] || return 0
    if [ "$free_kib" -lt $((want_gib * 1024 * 1024)) ]; then
        printf 'error: %s needs about %s GiB free at %s, and %s GiB is free; free some space (old checkouts, target/, ~/.cache/pip) and run again\n' \
            "$what" "$want_gib" "$dir" "$((free_kib / 1024 / 1024))" >&2
        exit 1
    fi
}

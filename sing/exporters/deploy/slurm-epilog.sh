#!/bin/sh
# Slurm Epilog: remove the ending job from the GPU files written by slurm-prolog.sh; a file
# left with no job is deleted, and the run's SLUID file (Slurm 26.05+) with it.
# Runs as root; never fails (a failing epilog drains the node).
DIR="${SING_GPU_JOB_DIR:-/run/sing/gpu-jobs}"
case "${SLURM_JOB_SLUID:-}" in
    */*|.*|'') ;;
    *) rm -f "$DIR.sluid/$SLURM_JOB_SLUID" ;;
esac
[ -n "${SLURM_JOB_ID:-}" ] && [ -d "$DIR" ] || exit 0
exec 9>"$DIR/.lock"
command -v flock >/dev/null && flock -w 10 9
for file in "$DIR"/*; do
    [ -f "$file" ] || continue
    grep -qx "$SLURM_JOB_ID" "$file" || continue
    tmp="$DIR/.$(basename "$file").$$"
    cp -p "$file" "$tmp"  # the prolog's mode and group, kept by writing into the copy
    grep -vx "$SLURM_JOB_ID" "$file" >"$tmp"
    if [ -s "$tmp" ]; then mv -f "$tmp" "$file"; else rm -f "$tmp" "$file"; fi
done
exit 0

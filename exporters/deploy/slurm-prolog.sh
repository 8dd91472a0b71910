#!/bin/sh
# Slurm Prolog: record which GPUs the starting job holds, one file per GPU index with the job
# ids inside (dcgm-exporter's --hpc-job-mapping-dir format), for `sing exporter`.
# Install on GPU nodes (slurm.conf `Prolog=/path/slurm-prolog.sh` with `PrologFlags=Alloc`, so it
# runs on every node of a job when allocated, not only where a step starts; docs/deploy.md).
# It runs as root; SLURM_JOB_GPUS holds the job's GPU indices on this node.
# A failing prolog drains the node, so this script never fails: it always exits 0.
DIR="${SING_GPU_JOB_DIR:-/run/sing/gpu-jobs}"
GPUS="${SLURM_JOB_GPUS:-${GPU_DEVICE_ORDINAL:-${CUDA_VISIBLE_DEVICES:-}}}"
[ -n "${SLURM_JOB_ID:-}" ] && [ -n "$GPUS" ] || exit 0
mkdir -p "$DIR" 2>/dev/null || exit 0
exec 9>"$DIR/.lock"
command -v flock >/dev/null && flock -w 10 9
for gpu in $(echo "$GPUS" | tr ',' ' '); do
    case "$gpu" in *[!0-9]*|'') continue ;; esac  # indices only (not UUIDs or MIG names)
    tmp="$DIR/.$gpu.$$"
    { [ -f "$DIR/$gpu" ] && grep -vx "$SLURM_JOB_ID" "$DIR/$gpu"; echo "$SLURM_JOB_ID"; } >"$tmp"
    mv -f "$tmp" "$DIR/$gpu"
done
exit 0

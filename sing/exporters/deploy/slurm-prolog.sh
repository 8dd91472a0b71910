#!/bin/sh
# Slurm Prolog: record which GPUs the starting job holds, one file per GPU index with the job
# ids inside (dcgm-exporter's --hpc-job-mapping-dir format), for `sing exporter`.
# Install on GPU nodes (slurm.conf `Prolog=/path/slurm-prolog.sh` with `PrologFlags=Alloc`, so it
# runs on every node of a job when allocated, not only where a step starts; docs/deploy.md).
# It runs as root; SLURM_JOB_GPUS holds the job's GPU indices on this node.
# The exporter runs unprivileged: where its group (SING_EXPORTER_GROUP, default sing-exporter)
# exists, the files are readable by that group only (directory 0750, files 0640); else by
# everyone (0755/0644), as `squeue` shows job ids to everyone. Only root writes them.
# Slurm 26.05+ sets SLURM_JOB_SLUID (new on every requeue) and by default names the job's
# cgroup v2 directory by it: the file $DIR.sluid/<SLUID> holds the job id, so the exporter can
# name the job of such a process and of such a cgroup (the GPU files keep dcgm-exporter's
# one-job-id-per-line form). A job without GPUs gets its SLUID file too: the exporter reads
# every job's cgroup.
# A failing prolog drains the node, so this script never fails: it always exits 0.
DIR="${SING_GPU_JOB_DIR:-/run/sing/gpu-jobs}"
GROUP="${SING_EXPORTER_GROUP:-sing-exporter}"
GPUS="${SLURM_JOB_GPUS:-${GPU_DEVICE_ORDINAL:-${CUDA_VISIBLE_DEVICES:-}}}"
SLUID="${SLURM_JOB_SLUID:-}"
case "$SLUID" in
    [sS]?????????????) case "$SLUID" in *[!0-9A-Za-z]*) SLUID="" ;; esac ;;
    *) SLUID="" ;;  # unset (before 26.05) or not a SLUID: never a path outside the directory
esac
[ -n "${SLURM_JOB_ID:-}" ] && [ -n "$GPUS$SLUID" ] || exit 0
mkdir -p "$DIR" 2>/dev/null || exit 0
if getent group "$GROUP" >/dev/null 2>&1 && chgrp "$GROUP" "$DIR" 2>/dev/null; then
    DMODE=0750; MODE=0640
else
    GROUP=""; DMODE=0755; MODE=0644
fi
chmod "$DMODE" "$DIR"
exec 9>"$DIR/.lock"
command -v flock >/dev/null && flock -w 10 9
for gpu in $(echo "$GPUS" | tr ',' ' '); do
    case "$gpu" in *[!0-9]*|'') continue ;; esac  # indices only (not UUIDs or MIG names)
    tmp="$DIR/.$gpu.$$"
    { [ -f "$DIR/$gpu" ] && grep -vx "$SLURM_JOB_ID" "$DIR/$gpu"; echo "$SLURM_JOB_ID"; } >"$tmp"
    chmod "$MODE" "$tmp"
    [ -z "$GROUP" ] || chgrp "$GROUP" "$tmp"
    mv -f "$tmp" "$DIR/$gpu"
done
[ -n "$SLUID" ] || exit 0
mkdir -p "$DIR.sluid" && chmod "$DMODE" "$DIR.sluid" || exit 0
[ -z "$GROUP" ] || chgrp "$GROUP" "$DIR.sluid"
tmp="$DIR.sluid/.$SLUID.$$"
echo "$SLURM_JOB_ID" >"$tmp" && chmod "$MODE" "$tmp"
[ -z "$GROUP" ] || chgrp "$GROUP" "$tmp"
mv -f "$tmp" "$DIR.sluid/$SLUID"
exit 0

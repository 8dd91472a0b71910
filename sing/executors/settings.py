"""The `[executor]` section of the site config: where jobs go and the cluster's job rules."""

from __future__ import annotations

from dataclasses import dataclass

from sing.config import ConfigError


@dataclass(frozen=True)
class ExecutorSettings:
    # Where `sing submit` sends jobs: "local" (this machine's GPUs) or "slurm".
    kind: str = "local"
    # Cluster rules applied to every profile (SING: GPU counts are powers of two so jobs pack
    # onto nodes; interactive jobs are small so they never hold a node hostage).
    max_gpus_per_node: int = 8
    interactive_max_gpus: int = 2
    # Local executor: GPU indices it hands out (None: every GPU NVML sees), where its job
    # records and locks live (relative to the config file), and the node name it records.
    local_gpus: list[int] | None = None
    local_state_dir: str = "var/local-jobs"
    local_node: str = ""
    # Job environments are built once per distinct environment under this directory (on the
    # node that runs the job; $HOME is expanded there).
    env_root: str = "$HOME/.cache/sing/envs"
    # Runs container-image entry points: "apptainer" or "singularity" (`exec --nv IMAGE CMD`).
    container_runtime: str = "apptainer"
    # `sing jobs sync`: re-read this much before the newest end time already stored (sacct
    # can show a job a little after it ended), and how far back the very first sync looks.
    sync_overlap_s: int = 600
    first_sync_days: int = 30
    # Seconds any scheduler command (squeue, sacct, sinfo, scontrol, scancel, sbatch) may take
    # before it is killed and counted as timed out: a hung slurmctld must not stall job sync,
    # policy rounds and drains without a word.
    command_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.command_timeout_s > 0:
            raise ConfigError(
                f"[executor] command_timeout_s = {self.command_timeout_s!r} must be more than 0"
            )

"""The `[policy.rules.NAME]` tables: what each kind of rule looks for, and who it spares.

A rule names a kind of waste (below), the figures that define it, its exemptions and its action
ladder. `load_rules` checks every table against `Rule` the way every config section is checked,
so a typo in a rule is an error naming the rule and the key, never a rule silently off.

Kinds:
- idle_gpus: the job's GPUs under `threshold` mean utilisation over the last `minutes`
  (window = "sliding") or since the job started (window = "since_start"); by default every GPU
  must idle, `idle_gpu_share` lets that share of them idle without a violation.
- multinode_idle: a job on 2+ nodes with an idle node (all its GPUs under `threshold`) or RDMA
  traffic under `min_rdma_bytes_per_node_hour` over the window.
- untouched_gpus: GPUs held since the job started that never had a sample above the idle sample
  level (more of them than `idle_gpu_share`, by default any).
- under_request: a job running `min_run_hours` or longer whose mean utilisation, or share of
  GPUs in use, is under `request_share` of what it asked for.
- excess_memory: a job that asked for `min_request_gib` or more of host memory and whose peak
  (its cgroups', summed over its nodes) stays under `request_share` of it over the window.
- excess_cores_per_gpu: a GPU job holding more than `max_cores_per_gpu` CPU cores per GPU whose
  CPU efficiency over the window is under `request_share`: idle cores the node's other GPUs lack.
The last two read the jobs' cgroups (`job_host_samples`, HOST_KINDS), not their GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sing.config import ConfigError, build_section
from sing.policy.settings import PolicySettings

IDLE_GPUS, MULTINODE_IDLE = "idle_gpus", "multinode_idle"
UNTOUCHED_GPUS, UNDER_REQUEST = "untouched_gpus", "under_request"
EXCESS_MEMORY, EXCESS_CORES_PER_GPU = "excess_memory", "excess_cores_per_gpu"
HOST_KINDS = (EXCESS_MEMORY, EXCESS_CORES_PER_GPU)  # judged on the cgroups' samples
KINDS = (IDLE_GPUS, MULTINODE_IDLE, UNTOUCHED_GPUS, UNDER_REQUEST, *HOST_KINDS)
SLIDING, SINCE_START = "sliding", "since_start"
LADDER = ("notify", "warn", "cancel")  # the order a ladder climbs


@dataclass(frozen=True)
class Rule:
    kind: str = ""
    enabled: bool = True
    description: str = ""  # the words users read; "" = the kind's own
    actions: list[str] = field(default_factory=lambda: ["notify"])  # subset of LADDER
    dry_run: bool = True  # false (and [policy] dry_run false): messages and cancels are real
    threshold: float = 0.05  # a GPU under this mean utilisation idles
    minutes: float = 60.0  # the sliding window, or how long a job runs before it is judged
    window: str = SLIDING  # "sliding" or "since_start"
    warn_after_minutes: float = 60.0  # still violating this long after the notice: warning
    grace_minutes: float = 60.0  # from the warning to the cancellation
    idle_gpu_share: float | None = None  # share of GPUs (nodes) that may idle; None = kind's
    min_rdma_bytes_per_node_hour: float = 1e9  # multinode_idle
    min_run_hours: float = 4.0  # under_request
    request_share: float = 0.25  # under_request, HOST_KINDS: used share of the request under this
    min_request_gib: float = 32.0  # excess_memory: smaller requests are not worth a message
    max_cores_per_gpu: float = 8.0  # excess_cores_per_gpu: the site's cores per GPU
    exempt_users: list[str] = field(default_factory=list)
    exempt_accounts: list[str] = field(default_factory=list)
    exempt_partitions: list[str] = field(default_factory=list)
    exempt_qos: list[str] = field(default_factory=list)
    exempt_names: list[str] = field(default_factory=list)  # job-name patterns (fnmatch)
    exempt_interactive_hours: float = 0.0  # interactive sessions shorter than this
    name: str = ""  # the NAME of [policy.rules.NAME], set by load_rules

    def window_start(self, now: datetime) -> datetime:
        """Where the sliding window begins (since-start rules look further back per job)."""
        return now - timedelta(minutes=self.minutes)

    def acts(self, settings: PolicySettings) -> bool:
        """True when this rule's messages and cancellations are real (not a dry run)."""
        return not settings.dry_run and not self.dry_run

    def says(self) -> str:
        """What the rule looks for, in the words of its messages."""
        return self.description or _SAYS[self.kind].format(rule=self)

    def holds(self) -> str:
        """What the job holds that others need, as the messages name it."""
        return _HOLDS.get(self.kind, "GPUs")


_SAYS = {
    IDLE_GPUS: "GPUs under {rule.threshold:.0%} utilisation for {rule.minutes:g} minutes",
    MULTINODE_IDLE: "a multi-node job whose nodes idle or barely talk to each other",
    UNTOUCHED_GPUS: "GPUs held that have not been used since the job started",
    UNDER_REQUEST: "a long job using under {rule.request_share:.0%} of what it requested",
    EXCESS_MEMORY: "a job whose peak host memory stays under {rule.request_share:.0%} of the "
    "memory it requested",
    EXCESS_CORES_PER_GPU: "a GPU job holding more than {rule.max_cores_per_gpu:g} CPU cores per "
    "GPU and using under {rule.request_share:.0%} of them",
}
_HOLDS = {EXCESS_MEMORY: "memory", EXCESS_CORES_PER_GPU: "CPU cores"}


def load_rules(settings: PolicySettings, where: str = "[policy.rules]") -> list[Rule]:
    """Every enabled rule of `[policy.rules]`, checked; a bad rule is a ConfigError."""
    rules = []
    for name, raw in settings.rules.items():
        rule = build_section(Rule, {**raw, "name": name}, f"{where} {name}")
        _check(rule, f"{where} {name}")
        if rule.enabled:
            rules.append(rule)
    return rules


def _check(rule: Rule, where: str) -> None:
    if rule.kind not in KINDS:
        raise ConfigError(f"{where}: kind = {rule.kind!r}; kinds: {', '.join(KINDS)}")
    if rule.window not in (SLIDING, SINCE_START):
        raise ConfigError(f"{where}: window = {rule.window!r}; use 'sliding' or 'since_start'")
    unknown = [a for a in rule.actions if a not in LADDER]
    if unknown or not rule.actions:
        raise ConfigError(f"{where}: actions = {rule.actions!r}; a subset of {list(LADDER)}")
    if [a for a in LADDER if a in rule.actions] != rule.actions:
        raise ConfigError(f"{where}: actions must keep the order {' -> '.join(LADDER)}")
    if "cancel" in rule.actions and "warn" not in rule.actions:
        raise ConfigError(f"{where}: 'cancel' needs 'warn' (the warning sets the deadline)")
    shares = {"threshold": rule.threshold, "request_share": rule.request_share}
    if rule.idle_gpu_share is not None:
        shares["idle_gpu_share"] = rule.idle_gpu_share
    for key, value in shares.items():
        if not 0 <= value <= 1:
            raise ConfigError(f"{where}: {key} = {value!r} must be between 0 and 1")
    positive = {
        "minutes": rule.minutes,
        "grace_minutes": rule.grace_minutes,
        "warn_after_minutes": rule.warn_after_minutes,
        "min_run_hours": rule.min_run_hours,
        "min_rdma_bytes_per_node_hour": rule.min_rdma_bytes_per_node_hour,
        "exempt_interactive_hours": rule.exempt_interactive_hours,
        "min_request_gib": rule.min_request_gib,
        "max_cores_per_gpu": rule.max_cores_per_gpu,
    }
    for key, value in positive.items():
        if value < 0:
            raise ConfigError(f"{where}: {key} = {value!r} must not be negative")

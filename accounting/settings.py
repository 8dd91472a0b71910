"""The `[accounting]` section: charge weights, allocations, energy and carbon."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class AccountingSettings:
    # Charge units per allocated GPU-hour by GPU model (as Slurm's TRESBillingWeights);
    # a model not listed is charged default_weight.
    gpu_weights: dict[str, float] = field(default_factory=dict)
    default_weight: float = 1.0

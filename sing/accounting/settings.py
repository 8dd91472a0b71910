"""The `[accounting]` section: charge weights, allocations, energy and carbon."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sing.accounting.periods import period_window
from sing.config import Config
from sing.errors import UserError


@dataclass(frozen=True)
class AccountingSettings:
    # Charge units per allocated GPU-hour by GPU model (as Slurm's TRESBillingWeights);
    # a model not listed (or unknown) is charged default_weight.
    gpu_weights: dict[str, float] = field(default_factory=dict)
    default_weight: float = 1.0
    # Charge units granted per account and period: {account = {"2026-11" = 5000.0}}; a period
    # is YYYY, YYYY-Qn, YYYY-MM, YYYY-Www or YYYY-MM-DD (sing.accounting.periods).
    allocations: dict[str, dict[str, float]] = field(default_factory=dict)
    # Host power of a node besides its GPUs (CPUs, memory, fans), in watts; a job is charged
    # its share of the node's GPUs. node_power_w_by_model overrides it per GPU model.
    node_power_w: float = 0.0
    node_power_w_by_model: dict[str, float] = field(default_factory=dict)
    # Facility overhead (power usage effectiveness): energy drawn = IT energy x pue.
    pue: float = 1.0
    # Grid carbon intensity in g CO2e per kWh: a constant, or an hourly CSV (time,g_per_kwh)
    # that wins when set. With neither, carbon is unknown (NULL).
    carbon_intensity: float = 0.0
    carbon_intensity_file: str = ""

    def __post_init__(self) -> None:
        where = "[accounting]"
        weights = {"default_weight": self.default_weight, **self.gpu_weights}
        for name, value in {**weights, **self.node_power_w_by_model}.items():
            if value < 0:
                raise UserError(f"{where} {name} = {value} must not be negative")
        if self.node_power_w < 0 or self.carbon_intensity < 0:
            raise UserError(f"{where} node_power_w and carbon_intensity must not be negative")
        if self.pue < 1:
            raise UserError(f"{where} pue = {self.pue} must be at least 1 (1 = no overhead)")
        for account, periods in self.allocations.items():
            for period, units in periods.items():
                period_window(period, where=f"{where} allocations.{account}")
                if units < 0:
                    raise UserError(f"{where} allocations.{account}.{period} must not be negative")

    def weight(self, model: str | None) -> float:
        """Charge units per GPU-hour of a model."""
        return self.gpu_weights.get(model or "", self.default_weight)

    def node_power(self, model: str | None) -> float:
        """Host power (W) of a node with this GPU model."""
        return self.node_power_w_by_model.get(model or "", self.node_power_w)

    @property
    def has_carbon(self) -> bool:
        return bool(self.carbon_intensity_file) or self.carbon_intensity > 0


def accounting_settings(config: Config) -> AccountingSettings:
    """The [accounting] section of `config`, its carbon intensity file relative to the config."""
    settings = config.section("accounting", AccountingSettings)
    if settings.carbon_intensity_file:
        path = str(config.resolve_path(settings.carbon_intensity_file))
        settings = replace(settings, carbon_intensity_file=path)
    return settings

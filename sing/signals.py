"""The registry of per-GPU gauge signals: one declaration each, from the NVML read to `sing job`.

A signal declared here needs no other code. Each part of sing reads this table:

- the exporter (sing/exporters/gpu.py) reads it from NVML, converts it to SI and serves it as
  a gauge `{gpu, uuid}`;
- the fake NVML (sing/testing/fake_nvml.py) answers the same NVML call from the GPU's
  scripted state (the description's key `key`, in SI units), in NVML's raw units;
- the collector (sing/collector/convert.py, dcgm_fields.py) maps sing's series and
  dcgm-exporter's to the `gpu_samples` column `key`;
- the warehouse (sing/schema.py) stores that column, and the rollup `job_gpu_signals`
  (sing/warehouse/rollups.py) keeps its per-job sums, counts and maxima;
- `sing job` (sing/warehouse/job_report.py) shows the per-job figure `figure` (a job note in
  job_notes.toml may use it too).

So adding a signal touches this file and, for the demo's fake nodes to script it,
sing/testing/default_node.yaml (docs/architecture.md, "Adding a signal, report or rule").
Signals that need more than one NVML call and a factor (GPM activity, counters, health flags)
are written out by hand in those modules.

This module imports only the standard library: the exporter, which may not load pyarrow, and
the warehouse both read it. NVML names are pynvml's, as strings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSignal:
    """One per-GPU gauge."""

    key: str  # the value's name in a reading, in the fake's state and as `gpu_samples` column
    metric: str  # the exporter's gauge
    help: str
    nvml_call: str  # the pynvml function that takes the device handle
    nvml_field: str = ""  # the member of its answer that holds the value; "": the answer itself
    # A pynvml NVML_*_SAMPLES constant: the exporter first takes the mean of the driver's samples
    # over its trailing window (nvmlDeviceGetSamples), as for GPU utilisation; `nvml_call` is
    # the fallback when the driver has none.
    nvml_samples: str = ""
    nvml_to_si: float = 1.0  # NVML's value x this = SI (0.01 for a percent)
    arrow_type: str = "float32"  # the column's pyarrow type, by its pyarrow function name
    dcgm_names: tuple[str, ...] = ()  # dcgm-exporter's series, the pre-4.6 name first
    dcgm_unit: str = ""  # as DCGM defines the value
    dcgm_to_si: float = 1.0
    per_job: str = "mean"  # the job's figure: "mean" or "max" over its GPUs' samples
    label: str = ""  # how `sing job` names it
    shown_as: str = "ratio"  # "ratio": a bar 0-100 %; else the unit printed after the number

    @property
    def figure(self) -> str:
        """The name of the per-job figure (`sing job --json`, job notes): e.g. mean_mem_util."""
        return f"{self.per_job}_{self.key}"


GPU_SIGNALS: tuple[GpuSignal, ...] = (
    GpuSignal(
        key="mem_util",
        metric="sing_gpu_memory_utilization_ratio",
        help="Share of the last 15 s device memory was read or written.",
        nvml_call="nvmlDeviceGetUtilizationRates",
        nvml_field="memory",
        nvml_samples="NVML_MEMORY_UTILIZATION_SAMPLES",
        nvml_to_si=0.01,
        dcgm_names=("DCGM_FI_DEV_MEM_COPY_UTIL",),  # not renamed in DCGM 4.6.0
        dcgm_unit="%",
        dcgm_to_si=0.01,
        label="Memory bandwidth",
    ),
)

PER_JOB = ("mean", "max")


def check(signals: tuple[GpuSignal, ...] = GPU_SIGNALS) -> None:
    """Refuse a registry that cannot work: a repeated key or metric, an unknown per-job rule."""
    for attribute in ("key", "metric"):
        names = [getattr(s, attribute) for s in signals]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"sing/signals.py: {attribute} repeated: {', '.join(repeated)}")
    for s in signals:
        if s.per_job not in PER_JOB:
            raise ValueError(f"sing/signals.py: {s.key}: per_job {s.per_job!r}; one of {PER_JOB}")


check()

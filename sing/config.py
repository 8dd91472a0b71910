"""The one site configuration file (TOML) that every `sing` command reads.

Each part of the system owns one section and describes it as a dataclass; `Config.section`
checks the file's keys and types against it, so a typo or a wrong type is an error that names
the file, the key and what is expected, instead of a silently ignored setting.

Lookup order for the file: `--config PATH`, `$SING_CONFIG`, `/etc/sing/sing.toml`; with none of
them the built-in defaults apply (the embedded demo needs no file). The current directory is not
searched: a config file can name job sources and paths, so running `sing` in someone else's
directory must not pick up their `sing.toml`; a file there is read only when named explicitly.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

# The one place searched when no file is named; only root can write there.
SYSTEM_CONFIG = Path("/etc/sing/sing.toml")
# The --config help of every entry point.
CONFIG_HELP = f"site config file (default: $SING_CONFIG, then {SYSTEM_CONFIG})"

# Top-level sections a site file may contain; the owning dataclass lives in each package.
KNOWN_SECTIONS = (
    "site",
    "thresholds",
    "exporter",
    "collector",
    "executor",
    "scheduler",
    "dashboard",
    "roles",
    "trace",
    "demo",
    "policy",
    "accounting",
    "health",
)


class ConfigError(Exception):
    """A setting is missing, unknown or of the wrong type; the message says what to fix."""


@dataclasses.dataclass(frozen=True)
class SiteSettings:
    """Settings shared by every command."""

    cluster: str = "campus"
    # Relative paths are resolved against the directory holding the config file.
    warehouse: str = "var/warehouse"


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Numbers behind the plain-language judgements in reports (admin-editable)."""

    idle_util: float = 0.05  # a GPU below this mean utilisation counts as idle
    low_util: float = 0.15  # below this a job's GPU efficiency is flagged as low
    low_rdma_bytes_per_node_hour: float = 1e9  # multi-node job "barely talks" under this
    idle_job_min_hours: float = 1.0  # idle-job report ignores allocations shorter than this
    memory_low_ratio: float = 0.1  # peak memory under this share of the card is flagged
    low_cpu_efficiency: float = 0.5  # a job using less of its cores' time than this is flagged
    # host memory: a job whose suggested request (its peak and a quarter, up to a power of two)
    # is at most this share of what it asked for per node is told so
    host_memory_low_ratio: float = 0.5
    notes_file: str = ""  # job-report notes (TOML); empty: sing/warehouse/job_notes.toml


class Config:
    """A parsed site configuration: raw TOML plus typed, validated sections."""

    def __init__(self, data: dict[str, Any], path: Path | None = None) -> None:
        self.path = path
        self.data = data
        unknown = [name for name in data if name not in KNOWN_SECTIONS]
        if unknown:
            raise ConfigError(
                f"{self._where()}: unknown section [{unknown[0]}]"
                f"{_suggest(unknown[0], KNOWN_SECTIONS)}; known sections: "
                + ", ".join(KNOWN_SECTIONS)
            )

    @classmethod
    def load(cls, path: str | Path | None = None) -> Config:
        """Read the config from `path`, `$SING_CONFIG` or /etc/sing/sing.toml, or use defaults."""
        candidate = path or os.environ.get("SING_CONFIG")
        if candidate:
            file = Path(candidate)
            if not file.is_file():
                raise ConfigError(f"config file {file} does not exist (from --config/SING_CONFIG)")
            return cls._from_file(file)
        if Path("sing.toml").is_file():
            log.warning(
                "ignoring ./sing.toml: the current directory is not searched; "
                "pass --config sing.toml to use it"
            )
        if SYSTEM_CONFIG.is_file():
            return cls._from_file(SYSTEM_CONFIG)
        return cls({}, None)

    @classmethod
    def _from_file(cls, file: Path) -> Config:
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"{file}: not valid TOML: {err}") from err
        except OSError as err:
            raise ConfigError(f"{file}: cannot read: {err.strerror}") from err
        return cls(data, file.resolve())

    def section(self, name: str, schema: type[T]) -> T:
        """Return section `name` as an instance of the dataclass `schema`, validated."""
        if name not in KNOWN_SECTIONS:
            raise ValueError(f"section {name!r} is not in KNOWN_SECTIONS")
        raw = self.data.get(name, {})
        if not isinstance(raw, dict):
            kind = type(raw).__name__
            raise ConfigError(f"{self._where()}: [{name}] must be a table, not {kind}")
        return build_section(schema, raw, f"{self._where()}: [{name}]")

    @property
    def site(self) -> SiteSettings:
        return self.section("site", SiteSettings)

    @property
    def thresholds(self) -> Thresholds:
        return self.section("thresholds", Thresholds)

    def resolve_path(self, value: str | Path) -> Path:
        """Resolve a path setting relative to the config file's directory (or the CWD)."""
        p = Path(value).expanduser()
        if p.is_absolute() or self.path is None:
            return p
        return self.path.parent / p

    def warehouse_dir(self, override: str | Path | None = None) -> Path | str:
        """Warehouse location: `--warehouse`, then `$SING_WAREHOUSE`, then [site] warehouse;
        an object-store URI (`s3://bucket/prefix`) is kept as it is (a Path would drop a `/`)."""
        site = self.site  # checked on every path: a typo in [site] fails with --warehouse too
        chosen = override or os.environ.get("SING_WAREHOUSE") or site.warehouse
        if isinstance(chosen, str) and chosen.startswith("s3://"):
            return chosen
        if override or os.environ.get("SING_WAREHOUSE"):
            return Path(chosen).expanduser()
        return self.resolve_path(site.warehouse)

    def _where(self) -> str:
        return str(self.path) if self.path else "built-in defaults"


def build_section(schema: type[T], raw: dict[str, Any], where: str) -> T:
    """`raw` (a TOML table) as the dataclass `schema`: unknown keys and wrong types are errors
    that say `where`."""
    fields = {f.name: f for f in dataclasses.fields(schema)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(schema)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise ConfigError(
                f"{where} has unknown key {key!r}{_suggest(key, fields)}; "
                f"valid keys: {', '.join(fields)}"
            )
        values[key] = _check_type(value, hints[key], f"{where} {key}")
    return schema(**values)


def _check_type(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _check_type(value, option, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where} = {value!r} is not one of {hint}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        (item,) = typing.get_args(hint)[:1]
        items = [_check_type(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table, got {value!r}")
        _, item = typing.get_args(hint)
        return {k: _check_type(v, item, f"{where}.{k}") for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is Any:
        return value
    wrong_bool = isinstance(value, bool) != (hint is bool)
    if isinstance(hint, type) and (not isinstance(value, hint) or wrong_bool):
        raise ConfigError(f"{where} must be {hint.__name__}, got {value!r}")
    return value


def _suggest(word: str, options: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""

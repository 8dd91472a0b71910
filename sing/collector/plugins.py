"""Pluggable sources named in the config as `module:function` (job records, node lists).

The collector does not depend on how a site runs jobs: a source is imported only when named.
A config file names code, but may only pick among what the admin installed: a source must be
registered as an entry point in the group `sing.sources` (sing's own are, in pyproject.toml; a
site's package registers its own the same way); any other name is refused, never imported. A
name from before sing's packages moved under `sing.` (`collector.jobsync:executor_sync`) is
read as its new name, with a warning.
The default sources read the configured `[executor]`; without that section, or with an
installed source that cannot be loaded, the source is off, said in one log line, and scraping
goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from sing.config import Config
from sing.errors import UserError

log = logging.getLogger(__name__)

GROUP = "sing.sources"


def installed_sources() -> dict[str, EntryPoint]:
    """The installed sources, by the `module:function` a config names them with."""
    return {f"{ep.module}:{ep.attr}": ep for ep in entry_points(group=GROUP)}


def load_source(spec: str, config: Config, default: str, what: str) -> Callable[..., Any] | None:
    """The installed function named `module:function`, or None (logged) when it is off or
    cannot be loaded; a name that is not installed is a UserError."""
    if not spec:
        return None
    if spec == default and "executor" not in config.data:
        log.info("%s off: the config has no [executor] section", what)
        return None
    installed = installed_sources()
    if spec not in installed and f"sing.{spec}" in installed:
        log.warning("[collector] %s = %r: sing's sources moved under sing., write %r", what, spec,
                    f"sing.{spec}")  # fmt: skip
        spec = f"sing.{spec}"
    if spec not in installed:
        raise UserError(
            f"[collector] {what} = {spec!r} is not an installed source (entry point group "
            f"{GROUP!r}); installed: {', '.join(sorted(installed)) or 'none'}"
        )
    try:
        function = installed[spec].load()
    except (ImportError, AttributeError) as err:
        log.warning("%s off: cannot load %s (%s)", what, spec, err)
        return None
    if not callable(function):
        log.warning("%s off: %s is not a function", what, spec)
        return None
    return function

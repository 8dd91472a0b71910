"""Pluggable sources named in the config as `module:function` (job records, node lists).

The collector does not depend on how a site runs jobs: a source is imported only when named.
The default sources read the configured `[executor]`; without that section, or with a source
that cannot be imported, the source is off, said in one log line, and scraping goes on.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from sing.config import Config
from sing.errors import UserError

log = logging.getLogger(__name__)


def load_source(spec: str, config: Config, default: str, what: str) -> Callable[..., Any] | None:
    """The function named `module:function`, or None (logged) when it is off or missing."""
    if not spec:
        return None
    if spec == default and "executor" not in config.data:
        log.info("%s off: the config has no [executor] section", what)
        return None
    module_name, _, function_name = spec.partition(":")
    if not function_name:
        raise UserError(f"[collector] {what} = {spec!r}: expected 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        log.warning("%s off: cannot import %s (%s)", what, module_name, err)
        return None
    function = getattr(module, function_name, None)
    if not callable(function):
        log.warning("%s off: %s has no function %s", what, module_name, function_name)
        return None
    return function

"""Test doubles: fake GPU nodes (a scripted NVML and the sysfs/procfs tree beside it).

The layer under sing.demo, above the product (docs/architecture.md): nothing in the product
imports it. The
exporter reaches the fake nodes only as the installed backend `fake` of the entry point group
`sing.exporter_backends` (`sing exporter --fake`), as a site's own backend would be reached.
"""

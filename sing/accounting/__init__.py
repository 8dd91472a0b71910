"""Accounting: who used what and what it cost, in charge units, energy and carbon
(docs/accounting.md)."""

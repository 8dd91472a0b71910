"""Accounting: who used what, what it cost in charge units, energy and carbon (docs/accounting.md)."""

"""Acting on waste: rules over the warehouse's numbers, a ladder of notify -> warn -> cancel,
messages people read, and an audit trail of every outcome (docs/policy.md)."""

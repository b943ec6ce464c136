"""Utilities of the appliance client: byte units, file helpers, class discovery, and the
cluster debug settings (`debug_args`, `ini`), which are kept but have nothing to act on here."""

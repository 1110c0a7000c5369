"""``accumguard watch``: the product (recording, declared K, findings, report)."""

"""accumguard: gradient accumulation that equals the large batch."""

"""Framework integrations (transformers, Lightning, Accelerate), each imported only when used."""

__all__: list[str] = []

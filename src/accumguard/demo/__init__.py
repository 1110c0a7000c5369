"""The built-in demo: tiny models and synthetic data (:mod:`.toy`), a catalogue of
correct and broken loops per engine (:mod:`.loops`) and the ``accumguard demo``
job (:mod:`.demo`). Top layer: nothing in the library imports it.
"""

__all__: list[str] = []

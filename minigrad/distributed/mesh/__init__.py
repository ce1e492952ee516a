"""The ranks as a grid: named axes (data, pipe, tensor, sequence...) and the groups along them.

:mod:`.topology` (``ProcessTopology``: coordinates <-> ranks, the group of every axis) and
:mod:`.parallel_context` (``dist.init_parallel``: Colossal-AI's config turned into those groups,
validated on every rank before any communication).
"""

"""The ranks as a grid: named axes (data, pipe, tensor, sequence...) and the groups along them.

:mod:`.rank_mesh` (``RankMesh``: the one grid type -- coordinates <-> ranks, slices, the group of
every slice from the process-wide table of ``group_for_ranks``), :mod:`.topology`
(``ProcessTopology``: DeepSpeed's names for a row-major mesh) and :mod:`.parallel_context`
(``dist.init_parallel``: Colossal-AI's config turned into those groups, validated on every rank
before any communication).
"""

"""Tools around models, by MegEngine's paths: :mod:`.module_stats` (parameters, FLOPs and
activation sizes per layer)."""

"""The process runtime: how ranks come to exist and find each other, before any collective.

:mod:`.settings` (defaults and environment variables), :mod:`.env` (what each launcher tells a
rank), :mod:`.store` and :mod:`.wire` (the authenticated TCP rendezvous and its framing),
:mod:`.objects` (Python objects as bytes, without pickle), :mod:`.output` and :mod:`.log`
(``[rank N]`` lines), :mod:`.launcher` (``@dist.launcher`` forks the ranks) and :mod:`.launch`
(``python -m minigrad.distributed.launch``, torchrun's command line).
"""

"""``rtanon anonymize-dir``: a Kaldi-style corpus anonymized for release, in this process or on Ray.

- ``run``: the run: checks before the first output, one voice per speaker, the manifest and resume, and the
  in-process executor (``run_corpus``, ``anonymize_dir``).
- ``on_ray``: the Ray executor (one actor per worker, Ray's ``ActorPool``), ``start_ray`` and ``stop_ray``.
- ``ray_watchdog``: ends the local Ray's processes when the driver is killed.
- ``bench``: ``rtanon anonymize-dir --bench``, throughput in this process and on Ray.

May import: the streaming core and the utilities at the package root (``engine``, ``config``, ``methods``,
``errors``, ...), ``rtanon.io``, ``identity``, ``stages``, ``neural`` (batching). Never ``live``, ``serve``,
``ui``, ``eval`` or ``train``. Ray is imported only inside ``on_ray``'s functions (the ``[corpus]`` extra).
"""

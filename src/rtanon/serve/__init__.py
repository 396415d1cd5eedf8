"""``rtanon serve``: many live voices on one machine, every stage batched across sessions.

- :mod:`rtanon.serve.protocol`: the wire format (a 20 ms frame of PCM16 with its sequence number;
  JSON control messages) and the checks on every message a client sends.
- :mod:`rtanon.serve.scheduler`: :class:`Scheduler` ticks every 20 ms, takes the frames that have
  arrived from every session and steps all sessions at once (:func:`rtanon.batch.run_batched`: one
  call per shared model and round); a frame answered after its deadline becomes comfort noise and
  is counted. :class:`StreamSession` is one connection's engine session, queue and counters.
- :mod:`rtanon.serve.server`: the WebSocket server (aiohttp): a bearer token on every connection,
  same-origin browsers only, loopback unless TLS (or ``--insecure``), session and rate limits; a
  client that breaks a rule is closed with its reason in one logged line.
- :mod:`rtanon.serve.client`: the load generator of ``rtanon bench --serve``.
- :mod:`rtanon.serve.remote`: ``rtanon connect``'s :class:`RemoteSession`, the engine ``Session``
  interface that the live loop runs, computed by the server (no model runtime on the client).
- ``static/``: the page at ``/?token=TOKEN`` (microphone -> AudioWorklet -> 16 kHz frames -> ``/ws`` ->
  the anonymized voice played back), plain HTML/JS.
"""

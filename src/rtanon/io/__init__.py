"""What rtanon reads and writes besides the live devices: audio files, Kaldi-style data directories and the
package's own data.

- ``audio``: audio files in and out, streamed (``read_audio``, ``anonymize_file``, ``probe``, ...).
- ``kaldi``: a Kaldi-style data directory (``KaldiDir``: ``wav.scp``, ``utt2spk``, ...) and its map files.
- ``resources``: package data loaded with ``importlib.resources`` (the demo utterance); nothing is downloaded.

May import: the root's utilities (``constants``, ``errors``, ``atomic``, ``paths``) only;
``audio.anonymize_file`` runs the session it is given. Never the streaming core (``engine``, ``methods``,
``batch``), ``live``, ``serve``, ``corpus``, ``eval``, ``ui`` or ``train``: every part of rtanon may import it.
"""

"""The live anonymizer's local control page (``rtanon live --ui``, ``rtanon ui``): ``server`` and ``static/``."""

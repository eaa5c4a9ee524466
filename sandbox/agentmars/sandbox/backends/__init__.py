"""Where a slot's commands run: ``process`` (bubblewrap) or ``docker``."""

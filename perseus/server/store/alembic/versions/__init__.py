"""One module per schema revision, oldest first: ``r<revision>_<what>.py``."""

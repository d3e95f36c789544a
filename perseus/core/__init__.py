"""The ground floor: the vocabulary every side shares (standard library only)."""

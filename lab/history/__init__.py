"""The run history: an SQLite index of the run folders (lab runs)."""

"""Package data: the shipped scenarios and their scripts (installed as lab.scenarios)."""

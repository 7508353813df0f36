"""Stage 1: the scenario model (model.py), its YAML loader with file/line/field errors (loader.py) and
finding a scenario by name (lookup.py)."""

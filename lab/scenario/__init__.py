"""Stage 1: the scenario schema and its YAML loader (file/line/field errors)."""

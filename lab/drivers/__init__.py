"""Drivers over single runs: matrix, bisect, ablation."""

"""Stage 5: the run folder, result.json and report.md."""

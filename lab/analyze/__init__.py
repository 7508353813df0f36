"""Stage 4: RawRun -> Evidence -> Verdict (loader log, tracebacks, Dynamo diagnostics, judge)."""

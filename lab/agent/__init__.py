"""The lab for agents: `lab mcp`, an MCP server (stdio, the `mcp` SDK) over the lab's verbs.

`policy` is what a caller may name (scenario names, folders under the runs folder, engines, bases)
and refuses the rest; `models` are the tools' typed results (`lab schema mcp-*`); `jobs` runs the
long verbs (run, bisect, triage) as `python -m lab ...` child processes, so that a cancelled call
stops them the way Ctrl-C does (their containers are removed); `server` registers the tools."""

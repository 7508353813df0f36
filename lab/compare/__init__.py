"""What changed between two runs (`lab compare`), and the paste-ready comment (`lab comment`)."""

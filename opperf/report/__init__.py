"""Stage 7: the replay report of a database (markdown, duration gaps, JSON summary, plots)."""

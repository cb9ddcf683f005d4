"""The embedded trace store: kept traces and a summary row per request, in one SQLite file."""

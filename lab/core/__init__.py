"""Shared foundation: errors, records passed between stages, cache folders, safe tar extraction, scrubbing."""

"""Tiny stand-in reproduction script used by the scenario tests."""

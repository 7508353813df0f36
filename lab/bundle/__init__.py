"""Bundles: manifest, archive, replay."""

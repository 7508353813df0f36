"""The bounded cache: what the lab keeps (images it built, base rootfs, uv's wheels, site trees, the
release index, collect_env answers), how big each part is, and evicting it least recently used first
under the `cache_cap` setting (`policy` is the pure rule, `inventory` takes stock and removes)."""

"""Stage 3: the container engines. Only this package imports `docker`."""

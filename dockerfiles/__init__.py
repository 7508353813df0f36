"""Package data: the Dockerfile templates (installed as lab.dockerfiles; read with importlib.resources)."""

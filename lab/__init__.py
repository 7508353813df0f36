"""torch-repro-lab: containerized reproductions of PyTorch bugs."""

__version__ = "0.1.0"

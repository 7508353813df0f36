# torch-repro-lab recipes. `just --list` shows them.

venv := ".venv/bin"

# Install and start what the host needs, then the lab into .venv
setup:
    bash bin/setup

# The main job: reproduce the AArch64 double-libgomp bug
demo:
    {{venv}}/lab run libgomp-aarch64

# Every test, the real Docker end-to-end runs included (the fast half runs beside the real
# runs; with arguments, one pytest with exactly them)
test *ARGS:
    bin/test {{ARGS}}

# Only the fast tests (no Docker, no real run of the local engine)
test-fast *ARGS:
    {{venv}}/pytest -m "not docker and not local and not slurm" {{ARGS}}

# The local engine's real runs (uv venvs, bubblewrap; no Docker needed)
test-local *ARGS:
    {{venv}}/pytest -m local {{ARGS}}

# The documentation site, rebuilt on every save (http://127.0.0.1:8000); tests/test_docs.py builds it --strict
docs:
    {{venv}}/mkdocs serve

# The Slurm engine's real jobs (bin/setup-slurm starts a one-node cluster on this host)
test-slurm *ARGS:
    {{venv}}/pytest -m slurm {{ARGS}}

lint:
    {{venv}}/ruff check lab tests bench

# Benchmarks: scripts that print ratios measured side by side
bench:
    {{venv}}/python bench/loader_parse.py
    {{venv}}/python bench/bisect_cost
    {{venv}}/python bench/warm_run
    {{venv}}/python bench/build_emulated

# Run the lab itself in a container against the host engine (base: pulled or bootstrapped)
compose-doctor:
    bash bin/compose-lab doctor

# Remove every container and image the lab created
clean:
    {{venv}}/lab clean

# The lab itself in a container, driving the host's Docker engine through its socket.
# Built from the same Debian base as the cases (bootstrapped when no registry answers):
#   bin/compose-lab doctor   (= LAB_BASE=$(lab build-base debian:bookworm) docker-compose ... run --rm lab doctor)
ARG BASE=debian:bookworm
FROM ${BASE}

ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*

COPY dockerfiles/lab-ca/ /etc/lab/
RUN python3 -m venv /opt/lab
ENV PATH=/opt/lab/bin:$PATH
# The package carries dockerfiles/ and scenarios/ as package data (lab.dockerfiles, lab.scenarios).
COPY pyproject.toml README.md /src/
COPY lab/ /src/lab/
COPY dockerfiles/ /src/dockerfiles/
COPY scenarios/ /src/scenarios/
RUN if [ -s /etc/lab/ca.crt ]; then export PIP_CERT=/etc/lab/ca.crt; fi \
 && pip install --no-cache-dir /src
ENTRYPOINT ["/bin/sh", "-c", "if [ -s /etc/lab/ca.crt ]; then export PIP_CERT=/etc/lab/ca.crt; fi; exec lab \"$@\"", "lab"]
CMD ["--help"]
